//! The CRD manifests in `config/crds/` are generated from the CustomResource types and match
//! KubeEdge's names, scopes and status subresources. To regenerate after changing the types:
//! `EDGEHIVE_WRITE_CRDS=1 cargo test -p edgehive-actors --test all kube_crds`.

use std::path::PathBuf;

use edgehive_actors::cloud::cluster::crds::{crd_manifests, crd_yaml, COPIED_CRDS};
use edgehive_actors::cloud::cluster::kube::kind_info;

fn crds_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/crds")
}

#[test]
fn committed_crds_equal_the_generated_ones() {
    let write = std::env::var_os("EDGEHIVE_WRITE_CRDS").is_some();
    let mut stale = Vec::new();
    for (file, crd) in crd_manifests() {
        let path = crds_dir().join(file);
        let generated = crd_yaml(&crd).unwrap();
        if write {
            std::fs::create_dir_all(crds_dir()).unwrap();
            std::fs::write(&path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != generated {
            stale.push(file);
        }
    }
    assert!(
        stale.is_empty(),
        "config/crds/ differs from the types for {stale:?}; regenerate with \
         EDGEHIVE_WRITE_CRDS=1 cargo test -p edgehive-actors --test all kube_crds"
    );
    let mut files: Vec<String> = std::fs::read_dir(crds_dir())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut expected: Vec<String> = crd_manifests()
        .into_iter()
        .map(|(file, _)| file.to_owned())
        .chain(COPIED_CRDS.iter().map(|(_, file)| (*file).to_owned()))
        .collect();
    expected.sort();
    assert_eq!(
        files, expected,
        "config/crds/ holds exactly the generated files"
    );
}

#[test]
fn crds_have_kubeedge_names_scopes_and_subresources() {
    // (kind, CRD name, scope, status subresource), as in KubeEdge's own CRDs.
    let kubeedge = [
        ("Device", "devices.devices.kubeedge.io", "Namespaced", false),
        (
            "DeviceModel",
            "devicemodels.devices.kubeedge.io",
            "Namespaced",
            false,
        ),
        (
            "DeviceStatus",
            "devicestatuses.devices.kubeedge.io",
            "Namespaced",
            false,
        ),
        (
            "ObjectSync",
            "objectsyncs.reliablesyncs.kubeedge.io",
            "Namespaced",
            true,
        ),
        (
            "ClusterObjectSync",
            "clusterobjectsyncs.reliablesyncs.kubeedge.io",
            "Cluster",
            true,
        ),
    ];
    let crds = crd_manifests();
    assert_eq!(crds.len(), kubeedge.len());
    for (kind, name, scope, status) in kubeedge {
        let (_, crd) = crds
            .iter()
            .find(|(_, crd)| crd.spec.names.kind == kind)
            .unwrap_or_else(|| panic!("no CRD for {kind}"));
        assert_eq!(crd.metadata.name.as_deref(), Some(name));
        assert_eq!(crd.spec.scope, scope, "{kind}");
        let version = &crd.spec.versions[0];
        let expected_version = if name.ends_with("devices.kubeedge.io") {
            "v1beta1"
        } else {
            "v1alpha1"
        };
        assert_eq!(version.name, expected_version, "{kind}");
        assert_eq!(version.subresources.is_some(), status, "{kind}");
        // The adapter's table agrees, so it patches status where the API server takes it.
        let info = kind_info(kind).unwrap();
        assert_eq!(info.crd.as_deref(), Some(name));
        assert_eq!(info.namespaced, scope == "Namespaced", "{kind}");
        assert_eq!(info.status_subresource, status, "{kind}");
    }
}

#[test]
fn crds_keep_kubeedge_field_names_and_unknown_fields() {
    let crds = crd_manifests();
    let schema = |kind: &str| {
        let (_, crd) = crds
            .iter()
            .find(|(_, c)| c.spec.names.kind == kind)
            .unwrap();
        let schema = crd.spec.versions[0].schema.as_ref().unwrap();
        serde_json::to_value(schema.open_api_v3_schema.as_ref().unwrap()).unwrap()
    };
    let device = schema("Device");
    let spec = &device["properties"]["spec"];
    for field in [
        "deviceModelRef",
        "nodeName",
        "properties",
        "protocol",
        "methods",
        "stateReport",
    ] {
        assert!(
            spec["properties"].get(field).is_some(),
            "Device spec.{field}"
        );
    }
    // Fields we do not model (newer protocol settings) survive the API server's pruning.
    assert_eq!(spec["x-kubernetes-preserve-unknown-fields"], true);
    let status = schema("DeviceStatus");
    let twin = &status["properties"]["status"]["properties"]["twins"]["items"]["properties"];
    for field in ["propertyName", "reported", "observedDesired"] {
        assert!(twin.get(field).is_some(), "DeviceStatus twin {field}");
    }
    let sync = schema("ObjectSync");
    for field in ["objectAPIVersion", "objectKind", "objectName"] {
        assert!(
            sync["properties"]["spec"]["properties"]
                .get(field)
                .is_some(),
            "{field}"
        );
    }
    assert!(sync["properties"]["status"]["properties"]
        .get("objectResourceVersion")
        .is_some());
}

#[test]
fn a_kubeedge_device_reads_into_the_typed_device_and_back() {
    use edgehive_actors::cloud::cluster::crds::Device;
    let manifest = serde_json::json!({
        "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
        "metadata": {"name": "thermo-1", "namespace": "default"},
        "spec": {
            "deviceModelRef": {"name": "thermo-model"},
            "nodeName": "edge-1",
            "protocol": {"protocolName": "modbus", "configData": {"port": "/dev/ttyS0"}},
            "properties": [{
                "name": "temperature",
                "desired": {"value": "20", "metadata": {"type": "int"}},
                "visitors": {"protocolName": "modbus", "configData": {"register": "HoldingRegister"}},
                "reportCycle": 10000, "collectCycle": 5000, "reportToCloud": true,
                "pushMethod": {"mqtt": {"address": "tcp://127.0.0.1:1883", "topic": "t", "qos": 0}}
            }],
            "methods": [{"name": "setTemp", "propertyNames": ["temperature"]}],
            "stateReport": {"reportToCloud": true, "reportCycle": 60000}
        }
    });
    let device: Device = serde_json::from_value(manifest.clone()).unwrap();
    assert_eq!(device.spec.node_name.as_deref(), Some("edge-1"));
    assert_eq!(
        device.spec.properties[0].desired.as_ref().unwrap().value,
        "20"
    );
    let back = serde_json::to_value(&device).unwrap();
    assert_eq!(
        back["spec"], manifest["spec"],
        "every KubeEdge field survives"
    );
}

#[test]
fn copied_kubeedge_crds_agree_with_the_adapters_kinds() {
    // (kind, CRD name, group, version, scope, status subresource), as in KubeEdge's v1.22.0
    // apps and router CRDs (copied, not generated).
    let kubeedge = [
        (
            "NodeGroup",
            "nodegroups.apps.kubeedge.io",
            "apps.kubeedge.io",
            "v1alpha1",
            "Cluster",
            true,
        ),
        (
            "EdgeApplication",
            "edgeapplications.apps.kubeedge.io",
            "apps.kubeedge.io",
            "v1alpha1",
            "Namespaced",
            true,
        ),
        (
            "Rule",
            "rules.rules.kubeedge.io",
            "rules.kubeedge.io",
            "v1",
            "Namespaced",
            false,
        ),
        (
            "RuleEndpoint",
            "ruleendpoints.rules.kubeedge.io",
            "rules.kubeedge.io",
            "v1",
            "Namespaced",
            false,
        ),
    ];
    assert_eq!(COPIED_CRDS.len(), kubeedge.len());
    for (kind, name, group, version_name, scope, status) in kubeedge {
        let (_, file) = COPIED_CRDS.iter().find(|(k, _)| *k == kind).unwrap();
        let text = std::fs::read_to_string(crds_dir().join(file)).unwrap();
        let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
            serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(crd.metadata.name.as_deref(), Some(name));
        assert_eq!(crd.spec.group, group);
        assert_eq!(crd.spec.names.kind, kind);
        assert_eq!(crd.spec.scope, scope, "{kind}");
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, version_name, "{kind}");
        assert_eq!(
            version
                .subresources
                .as_ref()
                .is_some_and(|s| s.status.is_some()),
            status,
            "{kind}"
        );
        let info = kind_info(kind).unwrap();
        assert_eq!(info.crd.as_deref(), Some(name));
        assert_eq!(info.resource.group, group);
        assert_eq!(info.resource.version, version_name);
        assert_eq!(info.resource.plural, crd.spec.names.plural);
        assert_eq!(info.namespaced, scope == "Namespaced", "{kind}");
        assert_eq!(info.status_subresource, status, "{kind}");
    }
}
