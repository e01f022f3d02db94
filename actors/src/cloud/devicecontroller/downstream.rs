//! DeviceController's downstream half: the Device and DeviceModel watches become membership
//! updates, models and devices for the nodes that have them.

use std::collections::HashMap;

use edgehive_protocols::object::is_newer;
use edgehive_protocols::{Operation, ResourceType};
use serde_json::{json, Value};

use super::device::{key_of, membership_device, model_of, node_of, DEVICES_API_VERSION};
use super::index::{lock, Devices};
use crate::cloud::cluster::{ClusterError, EventType, SharedCluster, WatchEvent};
use crate::cloud::contract::downstream;
use crate::cloud::contract::route::DEVICECONTROLLER as DEVICECONTROLLER_MODULE;
use crate::cloud::outbox::{Outbox, RETRY_INTERVAL};
use crate::cloud::watcher::{keep_all, KindWatcher, WatchMetrics};

pub(super) struct DeviceWatcher {
    pub(super) cluster: SharedCluster,
    pub(super) outbox: Outbox,
    pub(super) devices: Devices,
    /// DeviceModels as last seen, by (namespace, name).
    pub(super) models: HashMap<(String, String), Value>,
}

impl DeviceWatcher {
    /// Follows DeviceModels and Devices (each with [`KindWatcher`]: listed, then watched,
    /// listed again after a lag or a failure, only differences told) for as long as the
    /// actor lives.
    pub(super) async fn run(mut self, metrics: WatchMetrics) {
        let follow = |kind: &str| {
            KindWatcher::new(self.cluster.clone(), DEVICECONTROLLER_MODULE, kind)
                .keeping(keep_all)
                .counted(metrics.clone())
        };
        let mut models = follow("DeviceModel");
        let mut devices = follow("Device");
        let mut retry = tokio::time::interval(RETRY_INTERVAL);
        loop {
            // No event is taken while CloudHub has not taken what the last ones produced.
            self.outbox.room().await;
            // Biased: a model written before its device is known when the device arrives.
            tokio::select! {
                biased;
                change = models.next() => if let Some(event) = change.into_event() {
                    self.on_model(event);
                },
                change = devices.next() => if let Some(event) = change.into_event() {
                    self.on_device(event).await;
                },
                _ = retry.tick(), if !self.outbox.is_empty() => self.outbox.flush(),
            }
        }
    }

    /// Whether another device than `except` on `node` in `namespace` uses `model`.
    fn model_used(&self, node: &str, namespace: &str, model: &str, except: &str) -> bool {
        lock(&self.devices).model_used(node, namespace, model, except)
    }

    fn send_object(&mut self, node: &str, kind: &str, obj: &Value, operation: Operation) {
        let resource_type = if kind == "Device" {
            ResourceType::Device
        } else {
            ResourceType::DeviceModel
        };
        let message = downstream::device_object(
            node,
            resource_type,
            DEVICES_API_VERSION,
            kind,
            obj,
            operation,
        );
        self.outbox.send(message);
    }

    fn send_membership(&mut self, node: &str, added: Option<&Value>, removed: Option<&Value>) {
        self.outbox.send(downstream::membership_update(
            node,
            added.map(membership_device),
            removed.map(membership_device),
        ));
    }

    fn add_to_node(&mut self, node: &str, device: &Value) {
        let (namespace, name) = key_of(device);
        self.send_membership(node, Some(device), None);
        if let Some(model) = model_of(device) {
            if !self.model_used(node, &namespace, &model, &name) {
                if let Some(obj) = self.models.get(&(namespace.clone(), model)).cloned() {
                    self.send_object(node, "DeviceModel", &obj, Operation::Insert);
                }
            }
        }
        self.send_object(node, "Device", device, Operation::Insert);
    }

    fn remove_from_node(&mut self, node: &str, device: &Value) {
        let (namespace, name) = key_of(device);
        self.send_membership(node, None, Some(device));
        if let Some(model) = model_of(device) {
            if !self.model_used(node, &namespace, &model, &name) {
                if let Some(obj) = self.models.get(&(namespace.clone(), model)).cloned() {
                    self.send_object(node, "DeviceModel", &obj, Operation::Delete);
                }
            }
        }
        self.send_object(node, "Device", device, Operation::Delete);
    }

    async fn on_device(&mut self, event: WatchEvent) {
        let device = event.object;
        let key = key_of(&device);
        let old = lock(&self.devices).get(&key).cloned();
        match event.event_type {
            EventType::Deleted => {
                lock(&self.devices).remove(&key);
                if let Some(node) = node_of(&device) {
                    self.remove_from_node(&node, &device);
                }
            }
            EventType::Added | EventType::Modified => {
                if let Some(old) = &old {
                    if !is_newer(
                        device["metadata"]["resourceVersion"].as_str().unwrap_or(""),
                        old["metadata"]["resourceVersion"].as_str().unwrap_or(""),
                    ) {
                        return;
                    }
                }
                let old_node = old.as_ref().and_then(node_of);
                let new_node = node_of(&device);
                if old.is_none() {
                    self.ensure_status(&device).await;
                }
                if old_node != new_node {
                    if let (Some(node), Some(old)) = (&old_node, &old) {
                        // Forget it first so the model counts as unused on the old node.
                        lock(&self.devices).remove(&key);
                        self.remove_from_node(node, old);
                    }
                    lock(&self.devices).insert(key.clone(), device.clone());
                    if let Some(node) = &new_node {
                        self.add_to_node(node, &device);
                    }
                } else {
                    lock(&self.devices).insert(key.clone(), device.clone());
                    let changed = old.as_ref().is_some_and(|old| {
                        old["spec"] != device["spec"]
                            || old["metadata"]["labels"] != device["metadata"]["labels"]
                    });
                    if let (Some(node), true) = (&new_node, changed) {
                        self.send_object(node, "Device", &device, Operation::Update);
                    }
                }
            }
        }
    }

    /// Creates the Device's DeviceStatus (same name, owner-referenced) if it has none.
    async fn ensure_status(&self, device: &Value) {
        let (namespace, name) = key_of(device);
        let status = json!({
            "apiVersion": DEVICES_API_VERSION,
            "kind": "DeviceStatus",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "ownerReferences": [{
                    "apiVersion": DEVICES_API_VERSION, "kind": "Device", "name": name,
                    "uid": device["metadata"]["uid"], "controller": true,
                }],
            },
            "status": {},
        });
        match self.cluster.create(status).await {
            Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
            Err(error) => {
                tracing::warn!(%namespace, %name, %error, "cannot create the DeviceStatus")
            }
        }
    }

    fn on_model(&mut self, event: WatchEvent) {
        let model = event.object;
        let key = key_of(&model);
        let operation = match event.event_type {
            EventType::Deleted => {
                // KubeEdge sends model deletes only with the last device of a node.
                self.models.remove(&key);
                return;
            }
            EventType::Added | EventType::Modified => {
                let first = self.models.insert(key.clone(), model.clone()).is_none();
                if first {
                    Operation::Insert
                } else {
                    Operation::Update
                }
            }
        };
        let nodes = lock(&self.devices).nodes_using(&key.0, &key.1);
        for node in nodes {
            self.send_object(&node, "DeviceModel", &model, operation.clone());
        }
    }
}
