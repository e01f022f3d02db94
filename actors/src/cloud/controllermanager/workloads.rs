//! What an EdgeApplication asks for: one copy of each manifest per target NodeGroup, with
//! the group's overrides. Pure decisions, no I/O.
//!
//! A copy is named `<manifest name>-<group>` (KubeEdge's name overrider), lives in the
//! manifest's namespace (the application's when it names none), is owned by the
//! application (`ownerReferences`, controller), and runs on the group's nodes: a Deployment's
//! pod template gets the node selector `apps.kubeedge.io/belonging-to: <group>` (the whole
//! selector, as KubeEdge's), its replicas and container images the group's `replicas` and
//! `imageOverriders`, its containers the `envOverriders`, `commandOverriders`,
//! `argsOverriders` and `resourcesOverriders` (`overriders`); a Service gets the
//! annotation `apps.kubeedge.io/service-topology: range-nodegroup`. Kinds other than
//! Deployment and Service are not rendered (counted as skipped by the caller).

use edgehive_protocols::object::meta_str;
use serde_json::{json, Value};

use super::membership::BELONGING_TO;
use super::overriders;

/// The annotation KubeEdge gives a group's Service (its endpoint filter reads it).
pub const SERVICE_TOPOLOGY: &str = "apps.kubeedge.io/service-topology";

/// The kinds rendered.
pub(super) const KINDS: [&str; 2] = ["Deployment", "Service"];

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

/// Every workload application `app` asks for, by target group then manifest; manifests of
/// other kinds are left out and counted in the second value.
pub(super) fn render(app: &Value) -> (Vec<Workload>, usize) {
    let manifests = app["spec"]["workloadTemplate"]["manifests"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let targets = app["spec"]["workloadScope"]["targetNodeGroups"]
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
    let mut workloads = Vec::new();
    let mut skipped = 0;
    for target in &targets {
        let Some(group) = target["name"].as_str().filter(|g| !g.is_empty()) else {
            continue;
        };
        let overriders = &target["overriders"];
        for (ordinal, manifest) in manifests.iter().enumerate() {
            let kind = manifest["kind"].as_str().unwrap_or_default();
            let name = meta_str(manifest, "name");
            if !KINDS.contains(&kind) || name.is_empty() {
                skipped += 1;
                continue;
            }
            let mut object = manifest.clone();
            let metadata = &mut object["metadata"];
            metadata["name"] = json!(format!("{name}-{group}"));
            if meta_str(manifest, "namespace").is_empty() {
                metadata["namespace"] = json!(namespace);
            }
            metadata["ownerReferences"] = owner.clone();
            if let Some(fields) = metadata.as_object_mut() {
                for field in ["resourceVersion", "uid", "creationTimestamp"] {
                    fields.remove(field);
                }
            }
            if let Some(fields) = object.as_object_mut() {
                fields.remove("status");
            }
            if kind == "Deployment" {
                deployment_overrides(&mut object, group, overriders);
            } else {
                object["metadata"]["annotations"][SERVICE_TOPOLOGY] = json!("range-nodegroup");
            }
            workloads.push(Workload { ordinal, object });
        }
    }
    (workloads, skipped)
}

fn deployment_overrides(object: &mut Value, group: &str, overriders: &Value) {
    if let Some(replicas) = overriders["replicas"].as_i64() {
        object["spec"]["replicas"] = json!(replicas);
    }
    let pod = &mut object["spec"]["template"]["spec"];
    // KubeEdge's node selector overrider: the group's label is the whole selector.
    pod["nodeSelector"] = json!({ BELONGING_TO: group });
    let Some(containers) = pod["containers"].as_array_mut() else {
        return;
    };
    overriders::apply(containers, overriders);
    for overrider in overriders["imageOverriders"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for container in containers.iter_mut() {
            if let Some(image) = container["image"].as_str() {
                container["image"] = json!(override_image(image, overrider));
            }
        }
    }
}

/// `image` with one image overrider applied: `component` `Registry`, `Repository` or `Tag`,
/// `operator` `add`, `replace` (both set it) or `remove`, `value`.
fn override_image(image: &str, overrider: &Value) -> String {
    let (mut registry, mut repository, mut tag) = split_image(image);
    let value = overrider["value"].as_str().unwrap_or_default().to_owned();
    let set = match overrider["operator"].as_str() {
        Some("add" | "replace") => Some(value),
        Some("remove") => Some(String::new()),
        _ => None,
    };
    let Some(set) = set else {
        return image.to_owned();
    };
    match overrider["component"].as_str() {
        Some("Registry") => registry = set,
        Some("Repository") if !set.is_empty() => repository = set,
        Some("Tag") => tag = set,
        _ => return image.to_owned(),
    }
    let mut out = String::new();
    if !registry.is_empty() {
        out.push_str(&registry);
        out.push('/');
    }
    out.push_str(&repository);
    if !tag.is_empty() {
        if tag.starts_with('@') {
            out.push_str(&tag);
        } else {
            out.push(':');
            out.push_str(&tag);
        }
    }
    out
}

/// `[registry/]repository[:tag|@digest]` as its three parts (a digest keeps its `@`).
fn split_image(image: &str) -> (String, String, String) {
    let (rest, tag) = if let Some((rest, digest)) = image.split_once('@') {
        (rest, format!("@{digest}"))
    } else {
        match image.rsplit_once(':') {
            Some((rest, tag)) if !tag.contains('/') => (rest, tag.to_owned()),
            _ => (image, String::new()),
        }
    };
    match rest.split_once('/') {
        Some((first, repository))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (first.to_owned(), repository.to_owned(), tag)
        }
        _ => (String::new(), rest.to_owned(), tag),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_overriders_change_one_component() {
        let over = |component: &str, operator: &str, value: &str| json!({"component": component, "operator": operator, "value": value});
        assert_eq!(
            override_image("nginx:1.27", &over("Tag", "replace", "1.28")),
            "nginx:1.28"
        );
        assert_eq!(
            override_image(
                "docker.io/library/nginx:1.27",
                &over("Registry", "replace", "r.example:5000")
            ),
            "r.example:5000/library/nginx:1.27"
        );
        assert_eq!(
            override_image("nginx", &over("Registry", "add", "r.example")),
            "r.example/nginx"
        );
        assert_eq!(
            override_image("r.example/nginx:1", &over("Tag", "remove", "")),
            "r.example/nginx"
        );
    }

    #[test]
    fn each_group_gets_each_manifest_named_owned_and_overridden() {
        let app = json!({
            "apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "EdgeApplication",
            "metadata": {"name": "app", "namespace": "ns", "uid": "u1"},
            "spec": {
                "workloadTemplate": {"manifests": [
                    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                     "spec": {"replicas": 1, "template": {"spec": {"containers": [
                         {"name": "c", "image": "nginx:1.27"}]}}}},
                    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                     "spec": {"selector": {"app": "web"}}},
                    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
                ]},
                "workloadScope": {"targetNodeGroups": [
                    {"name": "east", "overriders": {"replicas": 3,
                        "imageOverriders": [{"component": "Tag", "operator": "replace", "value": "1.28"}]}},
                    {"name": "west"},
                ]},
            },
        });
        let (workloads, skipped) = render(&app);
        assert_eq!(skipped, 2);
        let names: Vec<_> = workloads.iter().map(|w| w.key()).collect();
        assert_eq!(
            names[0],
            ("Deployment".into(), "ns".into(), "web-east".into())
        );
        assert_eq!(names[3], ("Service".into(), "ns".into(), "web-west".into()));
        let east = &workloads[0].object;
        assert_eq!(east["spec"]["replicas"], 3);
        let pod = &east["spec"]["template"]["spec"];
        assert_eq!(pod["containers"][0]["image"], "nginx:1.28");
        assert_eq!(pod["nodeSelector"][BELONGING_TO], "east");
        assert_eq!(east["metadata"]["ownerReferences"][0]["uid"], "u1");
        let west = &workloads[2].object;
        assert_eq!(west["spec"]["replicas"], 1);
        assert_eq!(
            west["spec"]["template"]["spec"]["containers"][0]["image"],
            "nginx:1.27"
        );
        assert_eq!(
            workloads[1].object["metadata"]["annotations"][SERVICE_TOPOLOGY],
            "range-nodegroup"
        );
        assert_eq!(workloads[1].ordinal, 1);
    }
}
