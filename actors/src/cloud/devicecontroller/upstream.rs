//! DeviceController's upstream half: the edge twin's reports become DeviceStatus changes,
//! and membership requests are answered with the node's devices.

use actix::prelude::*;
use edgehive_protocols::Message;
use serde_json::{json, Value};

use super::controller::DeviceController;
use super::device::{key_of, membership_device, DEVICES_API_VERSION};
use super::index::lock;
use crate::cloud::cluster::{ClusterError, SharedCluster};
use crate::cloud::contract::downstream;
use crate::cloud::contract::twin::{TwinAsk, TwinRequest, TwinUnhandled};
use crate::cloud::outbox::{deliver_reply, offer_message};
use crate::hive::Envelope;

/// A twin report turned into a DeviceStatus change.
enum Report {
    Twins(Value),
    State(Value),
}

impl Handler<Envelope> for DeviceController {
    type Result = Option<Message>;

    /// Beehive messages from extensions: typed here, as CloudHub types what edges send.
    fn handle(&mut self, envelope: Envelope, ctx: &mut Context<Self>) -> Option<Message> {
        match TwinRequest::from_message(envelope.into_message()) {
            Ok(request) => self.handle(request, ctx),
            Err(unhandled) => self.handle(*unhandled, ctx),
        }
        None
    }
}

impl Handler<TwinUnhandled> for DeviceController {
    type Result = ();

    fn handle(&mut self, unhandled: TwinUnhandled, _: &mut Context<Self>) {
        let resource = unhandled.message.resource();
        if unhandled.reason == "unreadable content" {
            tracing::warn!(%resource, "device report with unreadable content; dropped");
        } else {
            tracing::debug!(%resource, reason = unhandled.reason, "device message not handled");
        }
        self.metrics.unhandled.inc();
    }
}

impl Handler<TwinRequest> for DeviceController {
    type Result = ();

    fn handle(&mut self, request: TwinRequest, ctx: &mut Context<Self>) {
        let TwinRequest { node, ask, message } = request;
        let (namespace, name, report) = match ask {
            TwinAsk::MembershipDetail => {
                self.answer_detail(&node, &message);
                return;
            }
            TwinAsk::Twins {
                namespace,
                name,
                report,
            } => (namespace, name, Report::Twins(report)),
            TwinAsk::State {
                namespace,
                name,
                report,
            } => (namespace, name, Report::State(report)),
        };
        let resource = message.resource();
        let Ok(waiting) = self.waiting.clone().try_acquire_owned() else {
            tracing::warn!(%resource, "too many device reports waiting; dropped");
            self.metrics.busy.inc();
            return;
        };
        let cluster = self.cluster.clone();
        let workers = self.workers.clone();
        let hive = self.hive.clone();
        let metrics = self.metrics.clone();
        let device = lock(&self.devices)
            .get(&(namespace.clone(), name.clone()))
            .cloned();
        ctx.spawn(actix::fut::wrap_future(async move {
            let Ok(_worker) = workers.acquire_owned().await else {
                return;
            };
            drop(waiting);
            let Some(device) = device else {
                tracing::warn!(%namespace, %name, "report for an unknown device; dropped");
                return;
            };
            match write_report(&cluster, &device, report).await {
                Ok(()) => {
                    metrics.status_updates.inc();
                    let reply = downstream::twin_report_ok(&message, &node);
                    if !deliver_reply(&hive, &metrics.sent, reply).await {
                        tracing::warn!(%namespace, %name, "cloudhub unavailable; reply dropped");
                        metrics.overflow.inc();
                    }
                }
                Err(error) => {
                    tracing::warn!(%namespace, %name, %error, "cannot update the DeviceStatus")
                }
            }
        }));
    }
}

impl DeviceController {
    fn answer_detail(&self, node: &str, request: &Message) {
        let mut devices: Vec<Value> = lock(&self.devices)
            .on_node(node)
            .map(membership_device)
            .collect();
        devices.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
        let reply = downstream::membership_detail(request, node, devices);
        if offer_message(&self.hive, &self.metrics.sent, reply).is_err() {
            self.metrics.overflow.inc();
        }
    }
}

/// A twin value as the DeviceStatus stores it: `{value, metadata {timestamp, type}}`.
fn status_value(twin_value: &Value, twin_type: &Value) -> Value {
    let mut metadata = json!({});
    match &twin_value["metadata"]["timestamp"] {
        Value::Number(n) => metadata["timestamp"] = json!(n.to_string()),
        Value::String(s) => metadata["timestamp"] = json!(s),
        _ => {}
    }
    if let Some(kind) = twin_type.as_str() {
        metadata["type"] = json!(kind);
    }
    json!({"value": twin_value["value"].as_str().unwrap_or_default(), "metadata": metadata})
}

async fn write_report(
    cluster: &SharedCluster,
    device: &Value,
    report: Report,
) -> Result<(), ClusterError> {
    let (namespace, name) = key_of(device);
    let status = match cluster.get("DeviceStatus", Some(&namespace), &name).await {
        Ok(status) => status,
        Err(ClusterError::NotFound { .. }) => {
            cluster
                .create(
                    json!({"apiVersion": DEVICES_API_VERSION, "kind": "DeviceStatus",
                    "metadata": {"name": name, "namespace": namespace}, "status": {}}),
                )
                .await?
        }
        Err(error) => return Err(error),
    };
    let patch = match report {
        Report::Twins(content) => {
            let declared: Vec<&str> = device["spec"]["properties"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["name"].as_str())
                .collect();
            let mut twins: Vec<Value> = status["status"]["twins"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let Some(reported) = content["twin"].as_object() else {
                return Ok(());
            };
            for (property, twin) in reported {
                if !declared.contains(&property.as_str()) {
                    continue;
                }
                let at = match twins
                    .iter()
                    .position(|t| t["propertyName"].as_str() == Some(property))
                {
                    Some(at) => at,
                    None => {
                        twins.push(json!({"propertyName": property}));
                        twins.len() - 1
                    }
                };
                let kind = &twin["metadata"]["type"];
                if twin["actual"].is_object() {
                    twins[at]["reported"] = status_value(&twin["actual"], kind);
                }
                if twin["expected"].is_object() {
                    twins[at]["observedDesired"] = status_value(&twin["expected"], kind);
                }
            }
            json!({"status": {"twins": twins}})
        }
        Report::State(content) => {
            let device = &content["device"];
            json!({"status": {
                "state": device["state"],
                "lastOnlineTime": device["lastOnlineTime"],
            }})
        }
    };
    cluster
        .patch("DeviceStatus", Some(&namespace), &name, patch, true)
        .await
        .map(|_| ())
}
