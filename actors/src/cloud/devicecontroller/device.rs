//! What DeviceController reads from Device objects.

use serde_json::{json, Value};

/// The devices API version.
pub(super) const DEVICES_API_VERSION: &str = "devices.kubeedge.io/v1beta1";
pub(super) fn key_of(obj: &Value) -> (String, String) {
    edgehive_protocols::object::namespaced_key(obj)
}

pub(super) fn node_of(device: &Value) -> Option<String> {
    device["spec"]["nodeName"]
        .as_str()
        .filter(|node| !node.is_empty())
        .map(str::to_owned)
}

pub(super) fn model_of(device: &Value) -> Option<String> {
    device["spec"]["deviceModelRef"]["name"]
        .as_str()
        .filter(|model| !model.is_empty())
        .map(str::to_owned)
}

/// The device as membership messages carry it: `{id, name, description}` (description from
/// the label `description`, omitted when absent).
pub(super) fn membership_device(device: &Value) -> Value {
    let (namespace, name) = key_of(device);
    let mut entry = json!({"id": format!("{namespace}/{name}"), "name": name});
    if let Some(description) = device["metadata"]["labels"]["description"].as_str() {
        entry["description"] = json!(description);
    }
    entry
}
