//! KubeEdge's custom resources as typed Rust: Device, DeviceModel and DeviceStatus
//! (`devices.kubeedge.io/v1beta1`), ObjectSync and ClusterObjectSync
//! (`reliablesyncs.kubeedge.io/v1alpha1`).
//!
//! The types carry the fields the controllers read (facts §8, §9) and generate the CRD
//! manifests in `config/crds/` ([`crd_manifests`]; a test keeps the committed files equal to
//! the generated ones). Group, version, kind, plural, scope and status subresource match
//! KubeEdge's own CRDs, so a cluster that already runs KubeEdge works as is, and KubeEdge's
//! cloudcore works on a cluster set up with ours. Device and DeviceModel specs and the
//! DeviceStatus status keep fields we do not model (`x-kubernetes-preserve-unknown-fields`):
//! KubeEdge adds protocol and push-method fields between releases, and the API server would
//! otherwise drop them from objects users write.
//!
//! NodeGroup and EdgeApplication (`apps.kubeedge.io/v1alpha1`, docs/nodegroups.md) have no
//! type here: their CRDs are KubeEdge's v1.22.0 files copied as they are ([`COPIED_CRDS`]),
//! and the controllers read those objects as JSON. So are Rule and RuleEndpoint
//! (`rules.kubeedge.io/v1`), which the Router extension reads.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{CustomResource, CustomResourceExt};
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The API group of KubeEdge's node groups and edge applications (NodeGroup,
/// EdgeApplication), whose CRDs are KubeEdge's files copied as they are.
pub const APPS_GROUP: &str = "apps.kubeedge.io";
/// Their version.
pub const APPS_VERSION: &str = "v1alpha1";
/// The API group of KubeEdge's Router rules (Rule, RuleEndpoint; docs/router.md), whose
/// CRDs are KubeEdge's files copied as they are.
pub const RULES_GROUP: &str = "rules.kubeedge.io";
/// Their version.
pub const RULES_VERSION: &str = "v1";
/// KubeEdge's CRD files in `config/crds/` that are copies of KubeEdge's own (v1.22.0), not
/// generated from a type here: kind and file.
pub const COPIED_CRDS: &[(&str, &str)] = &[
    ("NodeGroup", "apps_v1alpha1_nodegroup.yaml"),
    ("EdgeApplication", "apps_v1alpha1_edgeapplication.yaml"),
    ("Rule", "rules_v1_rule.yaml"),
    ("RuleEndpoint", "rules_v1_ruleendpoint.yaml"),
];

/// Schema of a free-form object whose fields the API server must keep.
fn preserved_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

/// A device instance: which model it follows, which node serves it, its properties.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "devices.kubeedge.io",
    version = "v1beta1",
    kind = "Device",
    doc = "A device instance, served by the edge node in spec.nodeName",
    namespaced,
    status = "DeviceReportStatus",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct DeviceSpec {
    /// The DeviceModel this device instantiates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_model_ref: Option<ObjectName>,
    /// The edge node that serves this device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The device's properties (unique by name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub properties: Vec<DeviceProperty>,
    /// How to reach the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<ProtocolConfig>,
    /// The device's methods (unique by name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<DeviceMethod>,
    /// Whether and how often the mapper reports the device's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_report: Option<ReportSettings>,
}

/// A reference by name to an object in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ObjectName {
    /// The referenced object's name.
    #[serde(default)]
    pub name: String,
}

/// One property of a device.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceProperty {
    /// The property name, unique in the device.
    #[serde(default)]
    pub name: String,
    /// The value the cloud wants the device to have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<TwinProperty>,
    /// How the mapper reads and writes the property.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visitors: Option<ProtocolConfig>,
    /// Milliseconds between reports to the cloud.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_cycle: Option<i64>,
    /// Milliseconds between reads from the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collect_cycle: Option<i64>,
    /// Whether the value is reported to the cloud.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_to_cloud: Option<bool>,
    /// Where the mapper pushes the value (http, mqtt, otel, dbMethod, anomalyDetection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub push_method: Option<Value>,
}

/// A property value with its metadata (e.g. a timestamp).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct TwinProperty {
    /// The value, as text.
    pub value: String,
    /// Extra facts about the value, such as when it was reported.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// A protocol name and its free-form configuration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProtocolConfig {
    /// The protocol's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_name: Option<String>,
    /// Protocol-specific settings, kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub config_data: Option<Value>,
}

/// A method of a device and the properties it controls.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceMethod {
    /// The method's name, unique in the device.
    #[serde(default)]
    pub name: String,
    /// What the method does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The properties the method controls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub property_names: Vec<String>,
}

/// Whether and how often something is reported to the cloud.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReportSettings {
    /// Whether it is reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_to_cloud: Option<bool>,
    /// Milliseconds between reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_cycle: Option<i64>,
}

/// `Device.status` in v1beta1: only the report settings (twins and state moved to
/// [`DeviceStatus`]); older fields are kept as written.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct DeviceReportStatus {
    /// Whether the device's status is reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_to_cloud: Option<bool>,
    /// Milliseconds between status reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_cycle: Option<i64>,
}

/// A device model: the properties and protocol its devices share.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "devices.kubeedge.io",
    version = "v1beta1",
    kind = "DeviceModel",
    doc = "A device model: the properties and protocol its devices share",
    namespaced,
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct DeviceModelSpec {
    /// The model's properties.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub properties: Vec<ModelProperty>,
    /// The protocol the model's devices speak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

/// One property of a device model.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelProperty {
    /// The property name.
    #[serde(default)]
    pub name: String,
    /// What the property means.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// INT, FLOAT, DOUBLE, STRING, BOOLEAN, BYTES or STREAM.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub value_type: Option<String>,
    /// ReadWrite or ReadOnly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<String>,
    /// Smallest value, as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum: Option<String>,
    /// Largest value, as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum: Option<String>,
    /// The value's unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
}

/// The reported state of a device (same name and namespace as the Device). Its spec is
/// empty: the Device it belongs to is its owner reference.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "devices.kubeedge.io",
    version = "v1beta1",
    kind = "DeviceStatus",
    doc = "The reported twins and state of the Device with the same name",
    namespaced,
    status = "DeviceStatusStatus",
    derive = "PartialEq",
    derive = "Default"
)]
pub struct DeviceStatusSpec {}

/// Twins, state and last online time of a device, as the DeviceController writes them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct DeviceStatusStatus {
    /// Reported and observed-desired values per property.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub twins: Vec<Twin>,
    /// The device's state (e.g. `online`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// When the device was last online.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_online_time: Option<String>,
    /// Further status, kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub extensions: Option<Value>,
}

/// The reported and observed-desired values of one property.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Twin {
    /// The property's name.
    #[serde(default)]
    pub property_name: String,
    /// The value the device reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported: Option<TwinProperty>,
    /// The desired value the mapper last saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_desired: Option<TwinProperty>,
}

/// Which namespaced object an edge node has persisted, by name `{node}.{object uid}`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "reliablesyncs.kubeedge.io",
    version = "v1alpha1",
    kind = "ObjectSync",
    doc = "Which namespaced object an edge node has persisted, at which resourceVersion",
    namespaced,
    status = "ObjectSyncStatus",
    derive = "PartialEq",
    derive = "Default"
)]
pub struct ObjectSyncSpec {
    /// The object's apiVersion.
    #[serde(
        rename = "objectAPIVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub object_api_version: Option<String>,
    /// The object's kind.
    #[serde(
        rename = "objectKind",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub object_kind: Option<String>,
    /// The object's name.
    #[serde(
        rename = "objectName",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub object_name: Option<String>,
}

/// Which cluster-scoped object an edge node has persisted, by name `{node}.{object uid}`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "reliablesyncs.kubeedge.io",
    version = "v1alpha1",
    kind = "ClusterObjectSync",
    doc = "Which cluster-scoped object an edge node has persisted, at which resourceVersion",
    status = "ObjectSyncStatus",
    derive = "PartialEq",
    derive = "Default"
)]
pub struct ClusterObjectSyncSpec {
    /// The object's apiVersion.
    #[serde(
        rename = "objectAPIVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub object_api_version: Option<String>,
    /// The object's kind.
    #[serde(
        rename = "objectKind",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub object_kind: Option<String>,
    /// The object's name.
    #[serde(
        rename = "objectName",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub object_name: Option<String>,
}

/// The resourceVersion of the object the edge acknowledged last.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ObjectSyncStatus {
    /// The acknowledged resourceVersion.
    #[serde(
        rename = "objectResourceVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub object_resource_version: Option<String>,
}

/// The CRDs edgehive needs, each with the file name it has in `config/crds/` (KubeEdge's
/// file names). Device and DeviceStatus get no status subresource, as in KubeEdge: KubeEdge's
/// cloud writes their status through the main resource, which a status subresource would
/// ignore.
pub fn crd_manifests() -> Vec<(&'static str, CustomResourceDefinition)> {
    let without_status_subresource = |mut crd: CustomResourceDefinition| {
        for version in &mut crd.spec.versions {
            version.subresources = None;
        }
        crd
    };
    // KubeEdge's CRDs accept objects without a spec (cloudcore creates DeviceStatuses with
    // none): drop the derive's top-level `required: [spec]`.
    let spec_optional = |mut crd: CustomResourceDefinition| {
        for version in &mut crd.spec.versions {
            if let Some(schema) = version
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
            {
                schema.required = None;
            }
        }
        crd
    };
    let crds = vec![
        (
            "devices_v1beta1_device.yaml",
            without_status_subresource(Device::crd()),
        ),
        ("devices_v1beta1_devicemodel.yaml", DeviceModel::crd()),
        (
            "devices_v1beta1_devicestatus.yaml",
            without_status_subresource(DeviceStatus::crd()),
        ),
        ("objectsync_v1alpha1.yaml", ObjectSync::crd()),
        ("cluster_objectsync_v1alpha1.yaml", ClusterObjectSync::crd()),
    ];
    crds.into_iter()
        .map(|(file, crd)| (file, spec_optional(crd)))
        .collect()
}

/// A CRD as the YAML committed in `config/crds/`, with a header saying where it comes from.
pub fn crd_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_yaml_ng::Error> {
    let body = serde_yaml_ng::to_string(crd)?;
    Ok(format!(
        "# Generated from actors/src/cloud/cluster/crds.rs; do not edit (a test compares them).\n\
         # Install with: kubectl apply -f config/crds/\n{body}"
    ))
}
