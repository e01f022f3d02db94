//! Which Kubernetes object a cloud message carries ([`ObjectId`]).

use std::sync::Arc;

use edgehive_protocols::object::meta_str;
use edgehive_protocols::{CloudResource, Group, Message, ResourceType};
use serde_json::Value;

/// Which Kubernetes object a `resource`-group message carries: what SyncController needs to
/// name its ObjectSync record (`{node}.{uid}`) and to find the object in the cluster again.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectId {
    /// `apiVersion` of the object (`v1`).
    pub api_version: String,
    /// Its kind (`Pod`).
    pub kind: String,
    /// Its namespace; empty for cluster-scoped kinds.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

impl ObjectId {
    /// The object `message` carries, if it is a `resource`-group message whose content has
    /// apiVersion, kind, name and UID. Nodes are left out: a node's own object is not
    /// something it can hold stale (the node's session ends when it is deleted).
    pub fn of(message: &Message) -> Option<Arc<ObjectId>> {
        if message.group() != Some(&Group::Resource) {
            return None;
        }
        let content = &message.content;
        let text = |value: &Value| value.as_str().filter(|s| !s.is_empty()).map(str::to_owned);
        let kind = text(&content["kind"])?;
        if kind == "Node" {
            return None;
        }
        Some(Arc::new(ObjectId {
            api_version: text(&content["apiVersion"])?,
            namespace: meta_str(content, "namespace").to_owned(),
            name: text(&content["metadata"]["name"])?,
            uid: text(&content["metadata"]["uid"])?,
            kind,
        }))
    }

    /// The cloud-form resource of this object on `node`:
    /// `node/{node}/{namespace or "null"}/{lowercase kind}/{name}`.
    pub(crate) fn resource_on(&self, node: &str) -> String {
        let namespace = if self.namespace.is_empty() {
            "null".to_owned()
        } else {
            self.namespace.clone()
        };
        CloudResource::new(
            node,
            namespace,
            ResourceType::from(self.kind.to_ascii_lowercase().as_str()),
            Some(self.name.clone()),
        )
        .to_string()
    }
}
