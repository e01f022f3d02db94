//! What an EdgeApplication asks for: its manifests made per target NodeGroup with the
//! group's overrides, or once as given, by kind (as KubeEdge v1.22's controller does); a
//! manifest it does not make is refused with why. Pure decisions, no I/O.
//!
//! Every object made is owned by the application (`ownerReferences`, controller) and lives
//! in the application's namespace (a manifest naming another is refused: Kubernetes' garbage
//! collector would delete a dependent whose owner is not in its namespace).
//!
//! - **Per group** ([`Shape::PerGroup`]): a Deployment is made once per target group, named
//!   `<manifest name>-<group>` (KubeEdge's name overrider). Its pod template gets the node
//!   selector `apps.kubeedge.io/belonging-to: <group>` (the whole selector, as KubeEdge's),
//!   its replicas and container images the group's `replicas` and `imageOverriders`
//!   (`images`), its containers the `envOverriders`, `commandOverriders`, `argsOverriders`
//!   and `resourcesOverriders` (`overriders`). Each `targetNodeLabels` entry gets one too,
//!   named `<manifest name>-ls-<hash>` and placed by node affinity (`selectors`), with its
//!   own overriders.
//! - **Ranged** ([`Shape::Ranged`]): a Service is made once, under its own name (clients
//!   address `web` in every group, as with KubeEdge v1.22), with the annotation
//!   `apps.kubeedge.io/service-topology: range-nodegroup`: its selector finds every group's
//!   pods, and DynamicController's service-topology filter shows each edge only the
//!   backends of its own group (`dynamiccontroller/topology.rs`).
//! - **Once** ([`Shape::Once`]): a ConfigMap, DaemonSet, StatefulSet or Job is made once, as
//!   given, under its own name: KubeEdge applies the group overriders to Deployments alone
//!   and makes every other manifest once, as written.
//! - **Refused** ([`Refused`]): any other kind (a Secret: the cloud writes no Secret; a
//!   cluster-scoped kind: it cannot be owned by a namespaced application; a kind the
//!   cloud's ClusterRole does not grant), a known kind at another apiVersion, a manifest
//!   without a name, or in another namespace; and a target's Deployment whose image
//!   predicate names no container image (`predicate`), or whose label selector is malformed
//!   or repeated (`label_selector`).

use edgehive_protocols::object::meta_str;
use serde_json::{json, Value};

use super::images::{self, PredicateError};
use super::membership::BELONGING_TO;
use super::overriders;
use super::selectors::{NodeLabels, SelectorError};

/// The annotation KubeEdge gives an application's Service (its endpoint filter reads it).
pub const SERVICE_TOPOLOGY: &str = "apps.kubeedge.io/service-topology";

/// How the controller makes a manifest of a kind it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One copy per target node group, with the group's overrides.
    PerGroup,
    /// One object under its own name, annotated `range-nodegroup` (its endpoints are
    /// filtered per group where they go to edges).
    Ranged,
    /// One object, as the manifest gives it.
    Once,
}

/// The kinds an EdgeApplication's manifests may hold: kind, the apiVersion it must give, and
/// how it is made. The cloud's ClusterRole grants `get`, `create`, `update`, `delete` on
/// each (deploy/manifests/02-clusterrole.yaml).
pub const WORKLOAD_KINDS: &[(&str, &str, Shape)] = &[
    ("Deployment", "apps/v1", Shape::PerGroup),
    ("Service", "v1", Shape::Ranged),
    ("ConfigMap", "v1", Shape::Once),
    ("DaemonSet", "apps/v1", Shape::Once),
    ("StatefulSet", "apps/v1", Shape::Once),
    ("Job", "batch/v1", Shape::Once),
];

/// One workload to be made: the object and which manifest it comes from.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Workload {
    /// The manifest's index in `spec.workloadTemplate.manifests`.
    pub(super) ordinal: usize,
    /// The object as it must be (no resourceVersion).
    pub(super) object: Value,
}

impl Workload {
    /// `(kind, namespace, name)`.
    pub(super) fn key(&self) -> (String, String, String) {
        (
            self.object["kind"].as_str().unwrap_or_default().to_owned(),
            meta_str(&self.object, "namespace").to_owned(),
            meta_str(&self.object, "name").to_owned(),
        )
    }
}

/// A manifest the controller does not make, and why.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Refused {
    /// The manifest's index in `spec.workloadTemplate.manifests`.
    pub(super) ordinal: usize,
    /// The counter's reason label: `kind`, `api_version`, `name`, `namespace`, `predicate`,
    /// `label_selector`.
    pub(super) reason: &'static str,
    /// What a user reads (the log line and the Event's message).
    pub(super) message: String,
    /// The manifest's kind, apiVersion, namespace and name as given.
    pub(super) kind: String,
    pub(super) api_version: String,
    pub(super) namespace: String,
    pub(super) name: String,
}

/// What an application asks for: the workloads (the ones made once, Services included,
/// first, in manifest order, then by target group and manifest) and the manifests refused.
#[derive(Debug, Default)]
pub(super) struct Rendered {
    pub(super) workloads: Vec<Workload>,
    pub(super) refused: Vec<Refused>,
}

/// How manifest `manifest` of an application in `namespace` is made, or why it is not.
fn judge(manifest: &Value, namespace: &str, ordinal: usize) -> Result<Shape, Box<Refused>> {
    let kind = manifest["kind"].as_str().unwrap_or_default();
    let api_version = manifest["apiVersion"].as_str().unwrap_or_default();
    let name = meta_str(manifest, "name");
    let given = meta_str(manifest, "namespace");
    let refuse = |reason: &'static str, message: String| {
        Box::new(Refused {
            ordinal,
            reason,
            message: format!("manifest {ordinal} ({api_version} {kind} {name:?}): {message}"),
            kind: kind.to_owned(),
            api_version: api_version.to_owned(),
            namespace: if given.is_empty() { namespace } else { given }.to_owned(),
            name: name.to_owned(),
        })
    };
    let taken = || {
        WORKLOAD_KINDS
            .iter()
            .map(|(kind, version, _)| format!("{version} {kind}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some((_, want, shape)) = WORKLOAD_KINDS.iter().find(|(k, _, _)| *k == kind) else {
        return Err(refuse(
            "kind",
            format!("the EdgeApplication controller makes only {}", taken()),
        ));
    };
    if api_version != *want {
        return Err(refuse(
            "api_version",
            format!("{kind} is made at apiVersion {want} only"),
        ));
    }
    if name.is_empty() {
        return Err(refuse("name", "metadata.name is missing".to_owned()));
    }
    if !given.is_empty() && given != namespace {
        return Err(refuse(
            "namespace",
            format!(
                "it names namespace {given:?}, not the application's {namespace:?} (an owned object lives in its owner's namespace)"
            ),
        ));
    }
    Ok(*shape)
}

/// Every workload application `app` asks for, and the manifests it refuses.
pub(super) fn render(app: &Value) -> Rendered {
    let manifests = app["spec"]["workloadTemplate"]["manifests"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let owner = json!([{
        "apiVersion": app["apiVersion"].as_str().unwrap_or("apps.kubeedge.io/v1alpha1"),
        "kind": "EdgeApplication",
        "name": meta_str(app, "name"),
        "uid": meta_str(app, "uid"),
        "controller": true,
        "blockOwnerDeletion": true,
    }]);
    let namespace = meta_str(app, "namespace");
    let mut rendered = Rendered::default();
    let mut per_group = Vec::new();
    for (ordinal, manifest) in manifests.iter().enumerate() {
        match judge(manifest, namespace, ordinal) {
            Err(refused) => rendered.refused.push(*refused),
            Ok(Shape::PerGroup) => per_group.push((ordinal, manifest)),
            Ok(Shape::Once) => rendered.workloads.push(Workload {
                ordinal,
                object: owned(manifest, None, namespace, &owner),
            }),
            Ok(Shape::Ranged) => {
                let mut object = owned(manifest, None, namespace, &owner);
                let annotations = &mut object["metadata"]["annotations"];
                if !annotations.is_object() {
                    // Absent (or not a map, which the API server would refuse anyway).
                    *annotations = json!({});
                }
                annotations[SERVICE_TOPOLOGY] = json!("range-nodegroup");
                rendered.workloads.push(Workload { ordinal, object });
            }
        }
    }
    for target in targets(app, &mut rendered, &per_group) {
        for (ordinal, manifest) in &per_group {
            let name = format!("{}-{}", meta_str(manifest, "name"), target.suffix);
            let mut object = owned(manifest, Some(&name), namespace, &owner);
            match deployment_overrides(&mut object, &target.place, &target.overriders) {
                Ok(()) => rendered.workloads.push(Workload {
                    ordinal: *ordinal,
                    object,
                }),
                Err(PredicateError(why)) => rendered.refused.push(Refused {
                    ordinal: *ordinal,
                    reason: "predicate",
                    message: format!(
                        "manifest {ordinal} (Deployment {name:?}) for {}: {why}",
                        target.what
                    ),
                    kind: "Deployment".to_owned(),
                    api_version: "apps/v1".to_owned(),
                    namespace: namespace.to_owned(),
                    name,
                }),
            }
        }
    }
    rendered
}

/// `manifest` as an object the application owns, in `namespace`, named `name` when given,
/// without what the API server sets.
fn owned(manifest: &Value, name: Option<&str>, namespace: &str, owner: &Value) -> Value {
    let mut object = manifest.clone();
    let metadata = &mut object["metadata"];
    if let Some(name) = name {
        metadata["name"] = json!(name);
    }
    metadata["namespace"] = json!(namespace);
    metadata["ownerReferences"] = owner.clone();
    if let Some(fields) = metadata.as_object_mut() {
        for field in ["resourceVersion", "uid", "creationTimestamp"] {
            fields.remove(field);
        }
    }
    if let Some(fields) = object.as_object_mut() {
        fields.remove("status");
    }
    object
}

/// Where a target's Deployment runs: a node group's nodes, or the nodes a label selector
/// matches.
enum Place {
    Group(String),
    Labels(NodeLabels),
}

/// One target of `spec.workloadScope`: a node group or a label selector, with its overriders.
struct Target {
    /// What the user wrote, for messages (`targetNodeGroups[0] (east)`).
    what: String,
    /// The name suffix of its Deployments: the group's name, or `ls-<hash>`.
    suffix: String,
    place: Place,
    overriders: Value,
}

/// The targets of `app`: its node groups (entries without a name skipped), then its label
/// selectors. A selector that is malformed, or the same as an earlier one, is refused for each
/// Deployment manifest (`label_selector`).
fn targets(app: &Value, rendered: &mut Rendered, per_group: &[(usize, &Value)]) -> Vec<Target> {
    let scope = &app["spec"]["workloadScope"];
    let list = |field: &str| scope[field].as_array().cloned().unwrap_or_default();
    let mut targets = Vec::new();
    for (index, target) in list("targetNodeGroups").iter().enumerate() {
        let Some(group) = target["name"].as_str().filter(|g| !g.is_empty()) else {
            continue;
        };
        targets.push(Target {
            what: format!("targetNodeGroups[{index}] ({group})"),
            suffix: group.to_owned(),
            place: Place::Group(group.to_owned()),
            overriders: target["overriders"].clone(),
        });
    }
    for (index, target) in list("targetNodeLabels").iter().enumerate() {
        let what = format!("targetNodeLabels[{index}]");
        let read = NodeLabels::read(&target["labelSelector"]).and_then(|labels| {
            let suffix = labels.suffix();
            match targets.iter().find(|t: &&Target| t.suffix == suffix) {
                Some(earlier) => Err(SelectorError(format!(
                    "its labelSelector gives the same workload name suffix ({suffix}) as {}'s: \
                     the same selector, or one whose keys and values run together the same way \
                     (KubeEdge hashes them with no separator)",
                    earlier.what
                ))),
                None => Ok((labels, suffix)),
            }
        });
        match read {
            Ok((labels, suffix)) => targets.push(Target {
                what,
                suffix,
                place: Place::Labels(labels),
                overriders: target["overriders"].clone(),
            }),
            Err(SelectorError(why)) => {
                let namespace = meta_str(app, "namespace");
                for (ordinal, manifest) in per_group {
                    let name = meta_str(manifest, "name");
                    rendered.refused.push(Refused {
                        ordinal: *ordinal,
                        reason: "label_selector",
                        message: format!(
                            "manifest {ordinal} (Deployment {name:?}) for {what}: {why}"
                        ),
                        kind: "Deployment".to_owned(),
                        api_version: "apps/v1".to_owned(),
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                    });
                }
            }
        }
    }
    targets
}

/// A target's overrides of its Deployment `object`: replicas, placement, the container
/// overriders, images (a predicate that names no container image refuses the Deployment).
fn deployment_overrides(
    object: &mut Value,
    place: &Place,
    overriders: &Value,
) -> Result<(), PredicateError> {
    if let Some(replicas) = overriders["replicas"].as_i64() {
        object["spec"]["replicas"] = json!(replicas);
    }
    match place {
        // KubeEdge's node selector overrider: the group's label is the whole selector.
        Place::Group(group) => {
            object["spec"]["template"]["spec"]["nodeSelector"] = json!({ BELONGING_TO: group });
        }
        Place::Labels(labels) => labels.place(object),
    }
    if let Some(containers) = object["spec"]["template"]["spec"]["containers"].as_array_mut() {
        overriders::apply(containers, overriders);
    }
    images::apply(object, overriders)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployments_are_made_per_group_overridden_a_service_once_under_its_name_ranged_other_kinds_once(
    ) {
        let app = json!({
            "apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "EdgeApplication",
            "metadata": {"name": "app", "namespace": "ns", "uid": "u1"},
            "spec": {
                "workloadTemplate": {"manifests": [
                    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                     "spec": {"replicas": 1, "template": {"spec": {"containers": [
                         {"name": "c", "image": "nginx:1.27"}]}}}},
                    {"apiVersion": "v1", "kind": "Service",
                     "metadata": {"name": "web", "annotations": {"team": "shop"}},
                     "spec": {"selector": {"app": "web"}}},
                    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "ns"},
                     "data": {"k": "v"}},
                    {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
                     "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "a:1"}]}}}},
                ]},
                "workloadScope": {"targetNodeGroups": [
                    {"name": "east", "overriders": {"replicas": 3,
                        "imageOverriders": [{"component": "Tag", "operator": "replace", "value": "1.28"}]}},
                    {"name": "west"},
                ]},
            },
        });
        let Rendered { workloads, refused } = render(&app);
        assert_eq!(refused, []);
        let names: Vec<_> = workloads.iter().map(|w| w.key()).collect();
        let key = |kind: &str, name: &str| (kind.to_owned(), "ns".to_owned(), name.to_owned());
        assert_eq!(
            names,
            [
                key("Service", "web"),
                key("ConfigMap", "x"),
                key("DaemonSet", "agent"),
                key("Deployment", "web-east"),
                key("Deployment", "web-west"),
            ]
        );
        // The Service: once, its own name, owned, the annotation beside the manifest's own.
        let service = &workloads[0];
        assert_eq!(service.ordinal, 1);
        let annotations = &service.object["metadata"]["annotations"];
        assert_eq!(annotations[SERVICE_TOPOLOGY], "range-nodegroup");
        assert_eq!(annotations["team"], "shop");
        assert_eq!(
            service.object["metadata"]["ownerReferences"][0]["uid"],
            "u1"
        );
        assert_eq!(service.object["spec"]["selector"]["app"], "web");
        // Made once, as given: no override, no node selector, owned.
        let daemonset = &workloads[2].object;
        assert_eq!(
            daemonset["spec"]["template"]["spec"]["containers"][0]["image"],
            "a:1"
        );
        assert!(daemonset["spec"]["template"]["spec"]["nodeSelector"].is_null());
        assert_eq!(daemonset["metadata"]["ownerReferences"][0]["uid"], "u1");
        assert_eq!(workloads[1].object["data"]["k"], "v");
        assert_eq!((workloads[1].ordinal, workloads[2].ordinal), (2, 3));
        let east = &workloads[3].object;
        assert_eq!(east["spec"]["replicas"], 3);
        let pod = &east["spec"]["template"]["spec"];
        assert_eq!(pod["containers"][0]["image"], "nginx:1.28");
        assert_eq!(pod["nodeSelector"][BELONGING_TO], "east");
        assert_eq!(east["metadata"]["ownerReferences"][0]["uid"], "u1");
        let west = &workloads[4].object;
        assert!(west["metadata"]["annotations"].is_null());
        assert_eq!(west["spec"]["replicas"], 1);
        assert_eq!(
            west["spec"]["template"]["spec"]["containers"][0]["image"],
            "nginx:1.27"
        );
    }

    #[test]
    fn a_manifest_of_another_kind_version_namespace_or_without_a_name_is_refused_with_why() {
        let manifests = json!([
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"}},
            {"apiVersion": "extensions/v1beta1", "kind": "Deployment", "metadata": {"name": "old"}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "kube-system"}},
            {"metadata": {"name": "nothing"}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ok"}},
        ]);
        let app = json!({
            "apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "EdgeApplication",
            "metadata": {"name": "app", "namespace": "ns", "uid": "u1"},
            "spec": {"workloadTemplate": {"manifests": manifests},
                     "workloadScope": {"targetNodeGroups": [{"name": "east"}]}},
        });
        let Rendered { workloads, refused } = render(&app);
        let reasons: Vec<_> = refused.iter().map(|r| (r.ordinal, r.reason)).collect();
        assert_eq!(
            reasons,
            [
                (0, "kind"),
                (1, "kind"),
                (2, "api_version"),
                (3, "name"),
                (4, "namespace"),
                (5, "kind"),
            ]
        );
        assert!(
            refused[0].message.contains("makes only"),
            "{}",
            refused[0].message
        );
        assert!(refused[4].message.contains("kube-system"));
        assert_eq!(refused[4].namespace, "kube-system");
        assert_eq!(workloads.len(), 1);
        assert_eq!(workloads[0].key().2, "ok");
    }
}
