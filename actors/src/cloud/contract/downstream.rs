//! The beehive messages cloud controllers send to nodes, built here and nowhere else in the
//! controllers: a controller names what it sends (an object's change, a node's delete, a
//! device membership update, a twin reply) and this module alone sets the router fields
//! (source, group, operation, resource), the header's resourceVersion and the content's
//! shape. Replies to EdgeController's requests are built in [`super::request`].
//!
//! What each builds is byte for byte what KubeEdge's cloudcore sends (the golden tests in
//! `actors/tests/hub_delivery.rs`, `cloud_controller_upstream.rs`, `devices_controller.rs`).

use edgehive_protocols::object::{meta_str, namespaced_key, now_ms};
use edgehive_protocols::{CloudResource, Group, Message, ModuleName, Operation, ResourceType};
use serde_json::{json, Value};

use super::object_id::ObjectId;

/// The message for `obj` of `kind` on `node`: source edgecontroller, group resource,
/// resourceversion = the object's, content = the object with apiVersion and kind (what
/// EdgeController sends for a change, and SyncController for a resend).
pub(crate) fn object_message(
    node: &str,
    resource_type: ResourceType,
    api_version: &str,
    kind: &str,
    obj: &Value,
    operation: Operation,
) -> Message {
    resource_message(
        ModuleName::EdgeController,
        node,
        resource_type,
        api_version,
        kind,
        obj,
        operation,
    )
}

/// A Device or DeviceModel (`resource_type`) for `node`: as [`object_message`], from
/// devicecontroller.
pub(crate) fn device_object(
    node: &str,
    resource_type: ResourceType,
    api_version: &str,
    kind: &str,
    obj: &Value,
    operation: Operation,
) -> Message {
    resource_message(
        ModuleName::DeviceController,
        node,
        resource_type,
        api_version,
        kind,
        obj,
        operation,
    )
}

fn resource_message(
    source: ModuleName,
    node: &str,
    resource_type: ResourceType,
    api_version: &str,
    kind: &str,
    obj: &Value,
    operation: Operation,
) -> Message {
    let (namespace, name) = namespaced_key(obj);
    let namespace = if resource_type == ResourceType::Node || namespace.is_empty() {
        "null".to_owned()
    } else {
        namespace
    };
    let resource = CloudResource::new(node, namespace, resource_type, Some(name));
    let mut content = obj.clone();
    content["apiVersion"] = Value::from(api_version);
    content["kind"] = Value::from(kind);
    Message::new(
        source,
        Group::Resource,
        operation,
        resource.to_string(),
        content,
    )
    .with_resource_version(meta_str(obj, "resourceVersion"))
}

/// The delete of `node` itself, sent when the Node is deleted from the cluster: no content
/// (`node/{n}/null/node/{n}`; KubeEdge's rules put it on the no-ACK lane).
pub(crate) fn node_delete(node: &str) -> Message {
    let resource = CloudResource::new(node, "null", ResourceType::Node, Some(node.to_owned()));
    Message::new(
        ModuleName::EdgeController,
        Group::Resource,
        Operation::Delete,
        resource.to_string(),
        Value::Null,
    )
}

/// SyncController's delete of an object the cluster no longer has (or has replaced): its
/// identity, enough for the edge to find and delete it, and no version.
pub(crate) fn object_gone(node: &str, id: &ObjectId) -> Message {
    let mut metadata = json!({"name": id.name, "uid": id.uid});
    if !id.namespace.is_empty() {
        metadata["namespace"] = json!(id.namespace);
    }
    Message::new(
        ModuleName::EdgeController,
        Group::Resource,
        Operation::Delete,
        id.resource_on(node),
        json!({"apiVersion": id.api_version, "kind": id.kind, "metadata": metadata}),
    )
}

/// EdgeController's delete for the edge of a pod it reports on but which is gone from the
/// cluster (or replaced by another with the same name): its identity, no version.
pub(crate) fn pod_gone(node: &str, namespace: &str, name: &str, uid: &str) -> Message {
    let pod = json!({
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
    });
    let mut message = object_message(
        node,
        ResourceType::Pod,
        "v1",
        "Pod",
        &pod,
        Operation::Delete,
    );
    message.header.resource_version = String::new();
    message
}

/// A device membership update for `node` (`node/{node}/membership`, group twin): the
/// devices `added` and `removed` (each in membership form, or none).
pub(crate) fn membership_update(
    node: &str,
    added: Option<Value>,
    removed: Option<Value>,
) -> Message {
    let list = |device: Option<Value>| match device {
        Some(device) => json!([device]),
        None => Value::Null,
    };
    Message::new(
        ModuleName::DeviceController,
        Group::Twin,
        Operation::Update,
        format!("node/{node}/membership"),
        json!({
            "event_id": uuid::Uuid::new_v4().to_string(),
            "timestamp": now_ms(),
            "added_devices": list(added),
            "removed_devices": list(removed),
        }),
    )
}

/// DeviceController's "OK" to a twin or state report from `node` (`node/{node}/twin`).
pub(crate) fn twin_report_ok(request: &Message, node: &str) -> Message {
    twin_reply(request, format!("node/{node}/twin"), json!("OK"))
}

/// DeviceController's answer to `node`'s `membership/detail`: its devices, in membership
/// form.
pub(crate) fn membership_detail(request: &Message, node: &str, devices: Vec<Value>) -> Message {
    twin_reply(
        request,
        format!("node/{node}/membership/detail"),
        json!({
            "event_id": uuid::Uuid::new_v4().to_string(),
            "timestamp": now_ms(),
            "devices": devices,
        }),
    )
}

fn twin_reply(request: &Message, resource: String, content: Value) -> Message {
    let mut reply = Message::response_to(request, content);
    reply.route.source = Some(ModuleName::DeviceController);
    reply.route.group = Some(Group::Twin);
    reply.route.resource = resource;
    reply
}
