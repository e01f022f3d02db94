//! KubeEdge's node groups through the real kube adapter: an `edgehive cloud` process with
//! the NodeGroup controller on, pointed at the stand-in API server (`edgehive cluster`) by a
//! kubeconfig, while the test acts as an operator with kubectl would, through kube-rs: it
//! creates `apps.kubeedge.io/v1alpha1` NodeGroups and EdgeApplications (dynamic API) and
//! reads what the cloud wrote (Node labels, statuses, Deployments, the Service).
//!
//! What the stand-in does not do that a real API server does (docs/nodegroups.md): it has no
//! garbage collector, so what an EdgeApplication owned is removed here by the controller's
//! own deletes; a real API server's collector removes it too.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node, Service};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{json, Value};

use crate::nodegroups::application;
use crate::standin_cluster::{client, start_standin};
use crate::support::process::{banner_field, plain_edge_yaml, spawn_logged, Process};
use crate::support::{eventually, metric_sum};

const LABEL: &str = "apps.kubeedge.io/belonging-to";
/// Generous: a debug cloud process on a loaded 2-core machine lists and watches every kind
/// through HTTPS before its controllers write.
const WITHIN: Duration = Duration::from_secs(90);

/// A running `edgehive cloud`: the process, its admin address (metrics) and where edges
/// connect (plain ws://).
struct Cloud {
    process: Process,
    admin: String,
    websocket: String,
}

/// `edgehive cloud` on the stand-in with the NodeGroup controller on, its config and log
/// named `name`.
fn start_cloud(dir: &Path, kubeconfig: &Path, name: &str) -> Cloud {
    let config = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &config,
        format!(
            "kubeAPIConfig:\n  kubeConfig: {}\n\
             commonConfig:\n  monitorServer:\n    bindAddress: 127.0.0.1:0\n\
             modules:\n  cloudHub:\n    websocket:\n      address: 127.0.0.1\n      port: 0\n      insecurePlaintext: true\n\
             \x20 nodeGroupController:\n    enable: true\n",
            kubeconfig.display()
        ),
    )
    .unwrap();
    let (process, banner) = spawn_logged(
        &["cloud", "--config", config.to_str().unwrap()],
        &dir.join(format!("{name}.log")),
    );
    Cloud {
        admin: banner_field(&banner, "admin on http://", ' ')
            .trim_end_matches(',')
            .to_owned(),
        websocket: banner_field(&banner, "WebSocket on ", ',').to_owned(),
        process,
    }
}

fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("apps.kubeedge.io", "v1alpha1", kind))
}

fn node_groups(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &resource("NodeGroup"))
}

fn applications(client: &kube::Client) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), "default", &resource("EdgeApplication"))
}

fn dynamic(value: Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

async fn create_node(nodes: &Api<Node>, name: &str, labels: Value) {
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    });
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(node).unwrap(),
        )
        .await
        .unwrap();
}

/// Waits until `node`'s belonging-to label is `want`, as the API shows it.
async fn label_becomes(nodes: &Api<Node>, node: &str, want: Option<&str>) {
    eventually(&format!("{node} labelled {want:?}"), WITHIN, || async {
        let found = nodes.get(node).await.ok()?;
        let label = found.metadata.labels.unwrap_or_default().remove(LABEL);
        (label.as_deref() == want).then_some(())
    })
    .await;
}

/// `(nodeName, selectionStatus)` of a group's `status.nodeStatuses`.
async fn node_statuses(groups: &Api<DynamicObject>, name: &str) -> Vec<(String, String)> {
    let Ok(group) = groups.get(name).await else {
        return Vec::new();
    };
    group.data["status"]["nodeStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let field = |f: &str| s[f].as_str().unwrap_or_default().to_owned();
            (field("nodeName"), field("selectionStatus"))
        })
        .collect()
}

async fn statuses_become(groups: &Api<DynamicObject>, name: &str, want: &[(&str, &str)]) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| ((*a).into(), (*b).into()))
        .collect();
    eventually(&format!("status of {name} = {want:?}"), WITHIN, || async {
        (node_statuses(groups, name).await == want).then_some(())
    })
    .await;
}

#[actix_rt::test]
async fn a_nodegroup_made_with_kubectl_labels_its_nodes_fills_its_status_and_a_node_that_leaves_loses_the_label(
) {
    let dir = tempfile::tempdir().unwrap();
    let standin = start_standin(dir.path(), 1000);
    let client = client(&standin.kubeconfig).await;
    let nodes: Api<Node> = Api::all(client.clone());
    create_node(&nodes, "edge-1", json!({"zone": "east"})).await;
    create_node(&nodes, "edge-2", json!({"zone": "east"})).await;
    create_node(&nodes, "edge-3", json!({"zone": "west"})).await;
    let _cloud = start_cloud(dir.path(), &standin.kubeconfig, "cloud");

    let groups = node_groups(&client);
    groups
        .create(
            &PostParams::default(),
            &dynamic(json!({
                "apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "NodeGroup",
                "metadata": {"name": "east"},
                "spec": {"matchLabels": {"zone": "east"}},
            })),
        )
        .await
        .unwrap();
    label_becomes(&nodes, "edge-1", Some("east")).await;
    label_becomes(&nodes, "edge-2", Some("east")).await;
    statuses_become(
        &groups,
        "east",
        &[("edge-1", "Succeeded"), ("edge-2", "Succeeded")],
    )
    .await;
    assert_eq!(
        nodes
            .get("edge-3")
            .await
            .unwrap()
            .metadata
            .labels
            .unwrap()
            .get(LABEL),
        None
    );

    // edge-2 moves to the west (as `kubectl label node edge-2 zone=west --overwrite`): it
    // leaves the group, loses the label, and the status no longer lists it.
    nodes
        .patch(
            "edge-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"zone": "west"}}})),
        )
        .await
        .unwrap();
    label_becomes(&nodes, "edge-2", None).await;
    statuses_become(&groups, "east", &[("edge-1", "Succeeded")]).await;

    // The group's spec changed to name edge-3: it joins.
    groups
        .patch(
            "east",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodes": ["edge-3"]}})),
        )
        .await
        .unwrap();
    label_becomes(&nodes, "edge-3", Some("east")).await;
    statuses_become(
        &groups,
        "east",
        &[("edge-1", "Succeeded"), ("edge-3", "Succeeded")],
    )
    .await;

    // Replaced whole without its status (`kubectl replace -f group.yaml`): a Kubernetes API
    // server keeps the status of a kind with a status subresource; the stand-in stores the
    // object as sent. Either way the status lists the group's nodes again.
    let mut replaced = groups.get("east").await.unwrap();
    replaced.data.as_object_mut().unwrap().remove("status");
    groups
        .replace("east", &PostParams::default(), &replaced)
        .await
        .unwrap();
    statuses_become(
        &groups,
        "east",
        &[("edge-1", "Succeeded"), ("edge-3", "Succeeded")],
    )
    .await;

    // The group deleted: its nodes lose the label.
    groups
        .delete("east", &DeleteParams::default())
        .await
        .unwrap();
    label_becomes(&nodes, "edge-1", None).await;
    label_becomes(&nodes, "edge-3", None).await;
}

/// `kind/name: conditions` of each entry of the application's `status.workloadStatus`.
async fn workload_statuses(apps: &Api<DynamicObject>) -> Vec<String> {
    let Ok(app) = apps.get("shop").await else {
        return Vec::new();
    };
    app.data["status"]["workloadStatus"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            format!(
                "{}/{}: {}",
                s["identifier"]["kind"].as_str().unwrap_or_default(),
                s["identifier"]["name"].as_str().unwrap_or_default(),
                s["conditions"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

#[actix_rt::test]
async fn an_edgeapplication_made_with_kubectl_gets_owned_per_group_deployments_one_ranged_service_and_a_status(
) {
    let dir = tempfile::tempdir().unwrap();
    let standin = start_standin(dir.path(), 1000);
    let client = client(&standin.kubeconfig).await;
    let cloud = start_cloud(dir.path(), &standin.kubeconfig, "cloud");
    let admin = &cloud.admin;
    let apps = applications(&client);
    let created = apps
        .create(
            &PostParams::default(),
            &dynamic(application(json!([
                {"name": "east", "overriders": {"replicas": 3, "imageOverriders": [
                    {"component": "Tag", "operator": "replace", "value": "1.28"}]}},
                {"name": "west"},
            ]))),
        )
        .await
        .unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let east = eventually("web-east", WITHIN, || async {
        deployments.get("web-east").await.ok()
    })
    .await;
    let spec = east.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(3));
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.containers[0].image.as_deref(), Some("nginx:1.28"));
    assert_eq!(
        pod.node_selector
            .as_ref()
            .unwrap()
            .get(LABEL)
            .map(String::as_str),
        Some("east")
    );
    let owner = &east.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("EdgeApplication", uid.as_str())
    );
    assert_eq!(owner.controller, Some(true));
    let west = eventually("web-west", WITHIN, || async {
        deployments.get("web-west").await.ok()
    })
    .await;
    let west_pod = west.spec.unwrap().template.spec.unwrap();
    assert_eq!(west_pod.containers[0].image.as_deref(), Some("nginx:1.27"));
    let service = eventually("service web", WITHIN, || async {
        services.get("web").await.ok()
    })
    .await;
    assert_eq!(
        service
            .metadata
            .annotations
            .unwrap()
            .get("apps.kubeedge.io/service-topology")
            .map(String::as_str),
        Some("range-nodegroup")
    );
    assert_eq!(service.metadata.owner_references.unwrap()[0].uid, uid);
    eventually("workloadStatus", WITHIN, || async {
        let found = workload_statuses(&apps).await;
        (found
            == [
                "Deployment/web-east: Available",
                "Deployment/web-west: Available",
                "Service/web: Available",
            ])
        .then_some(())
    })
    .await;

    // The operator changes east's replicas and drops west (kubectl apply of a new spec).
    apps.patch(
        "shop",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"workloadScope": {"targetNodeGroups": [
            {"name": "east", "overriders": {"replicas": 2}}]}}})),
    )
    .await
    .unwrap();
    eventually("web-west gone, web-east at 2 replicas", WITHIN, || async {
        let west = deployments.get_opt("web-west").await.ok()?;
        let east = deployments.get("web-east").await.ok()?;
        let spec = east.spec?;
        let image = spec.template.spec?.containers[0].image.clone();
        (west.is_none() && spec.replicas == Some(2) && image.as_deref() == Some("nginx:1.27"))
            .then_some(())
    })
    .await;

    // Deleted: what it owned goes (the controller's deletes; the stand-in has no garbage
    // collector).
    apps.delete("shop", &DeleteParams::default()).await.unwrap();
    eventually("the application's workloads gone", WITHIN, || async {
        let left = deployments
            .list(&Default::default())
            .await
            .ok()?
            .items
            .len()
            + services.list(&Default::default()).await.ok()?.items.len();
        (left == 0).then_some(())
    })
    .await;
    let metrics = crate::support::process::http(admin, "GET", "/metrics", "")
        .unwrap()
        .1;
    assert_eq!(
        metric_sum(
            &metrics,
            "edgehive_nodegroupcontroller_writes_total{what=\"workload\",result=\"failed\"}"
        ),
        0,
        "{metrics}"
    );
}

#[actix_rt::test]
async fn a_group_dropped_or_an_application_deleted_while_the_cloud_was_down_loses_its_workloads_when_it_returns(
) {
    let dir = tempfile::tempdir().unwrap();
    let standin = start_standin(dir.path(), 1000);
    let client = client(&standin.kubeconfig).await;
    let cloud = start_cloud(dir.path(), &standin.kubeconfig, "cloud-1");
    let apps = applications(&client);
    apps.create(
        &PostParams::default(),
        &dynamic(application(json!([{"name": "east"}, {"name": "west"}]))),
    )
    .await
    .unwrap();
    // A second application, with a ConfigMap, is deleted while the cloud is down.
    apps.create(
        &PostParams::default(),
        &dynamic(json!({
            "apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "EdgeApplication",
            "metadata": {"name": "settings", "namespace": "default"},
            "spec": {"workloadTemplate": {"manifests": [
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
                 "data": {"mode": "a"}}]},
                     "workloadScope": {"targetNodeGroups": [{"name": "east"}]}},
        })),
    )
    .await
    .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    eventually("both applications' workloads", WITHIN, || async {
        let west = deployments.get_opt("web-west").await.ok()??;
        let east = deployments.get_opt("web-east").await.ok()??;
        let settings = config_maps.get_opt("settings").await.ok()??;
        Some((west, east, settings))
    })
    .await;
    cloud.process.terminate();

    // While it is down: west is dropped from shop's targets, and the settings application
    // is deleted (the stand-in, like the embedded cluster, has no garbage collector).
    apps.patch(
        "shop",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"workloadScope": {"targetNodeGroups": [{"name": "east"}]}}})),
    )
    .await
    .unwrap();
    apps.delete("settings", &DeleteParams::default())
        .await
        .unwrap();
    let _cloud = start_cloud(dir.path(), &standin.kubeconfig, "cloud-2");
    eventually(
        "web-west and the deleted application's ConfigMap gone",
        WITHIN,
        || async {
            let west = deployments.get_opt("web-west").await.ok()?;
            let settings = config_maps.get_opt("settings").await.ok()?;
            (west.is_none() && settings.is_none()).then_some(())
        },
    )
    .await;
    // What is still asked for stays.
    assert!(deployments.get_opt("web-east").await.unwrap().is_some());
    assert!(services.get_opt("web").await.unwrap().is_some());
}

#[actix_rt::test]
async fn a_refused_manifest_is_a_warning_event_kubectl_describe_shows_and_a_counted_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let standin = start_standin(dir.path(), 1000);
    let client = client(&standin.kubeconfig).await;
    let cloud = start_cloud(dir.path(), &standin.kubeconfig, "cloud");
    let admin = &cloud.admin;
    let apps = applications(&client);
    let mut app = application(json!([{"name": "east", "overriders": {"imageOverriders": [
        {"component": "Tag", "operator": "replace", "value": "9",
         "predicate": {"path": "/metadata/namespace"}}]}}]));
    app["spec"]["workloadTemplate"]["manifests"]
        .as_array_mut()
        .unwrap()
        .push(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token"}}));
    let created = apps
        .create(&PostParams::default(), &dynamic(app))
        .await
        .unwrap();
    let uid = created.metadata.uid.unwrap();
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let said = eventually("two Warning Events on the application", WITHIN, || async {
        let mut said: Vec<String> = events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.uid.as_deref() == Some(uid.as_str())
                    && e.type_.as_deref() == Some("Warning")
                    && e.reason.as_deref() == Some("ManifestRefused")
            })
            .filter_map(|e| e.message)
            .collect();
        said.sort();
        (said.len() == 2).then_some(said)
    })
    .await;
    assert!(said[0].contains("/metadata/namespace"), "{said:?}");
    assert!(said[1].contains("Secret"), "{said:?}");
    let metrics = || {
        crate::support::process::http(admin, "GET", "/metrics", "")
            .unwrap()
            .1
    };
    let refused = |metrics: &str, reason: &str| {
        metric_sum(
            metrics,
            &format!("edgehive_nodegroupcontroller_refused_total{{reason=\"{reason}\"}}"),
        )
    };
    let counted = metrics();
    assert_eq!(
        (refused(&counted, "predicate"), refused(&counted, "kind")),
        (1, 1),
        "{counted}"
    );
    // The Service is made; neither refused workload is, in any namespace.
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    eventually("service web", WITHIN, || async {
        services.get_opt("web").await.ok()?
    })
    .await;
    let deployments: Api<Deployment> = Api::all(client.clone());
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "default");
    assert!(deployments
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .is_empty());
    assert!(secrets
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .is_empty());
}

/// An edge process on `websocket` (plain ws://) with its MetaServer on a free loopback
/// port; returns the process and the MetaServer's address.
fn start_edge_with_metaserver(dir: &Path, node: &str, websocket: &str) -> (Process, String) {
    let edge_dir = dir.join(node);
    std::fs::create_dir_all(&edge_dir).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let meta_server = format!("127.0.0.1:{port}");
    let mut yaml = plain_edge_yaml(node, websocket, &edge_dir.join("edge.db"), 15);
    yaml.push_str(&format!(
        "  metaManager:\n    metaServer:\n      enable: true\n      server: {meta_server}\n"
    ));
    let config = edge_dir.join("edge.yaml");
    std::fs::write(&config, yaml).unwrap();
    let (process, _) = spawn_logged(
        &["edge", "--config", config.to_str().unwrap()],
        &edge_dir.join("edge.log"),
    );
    (process, meta_server)
}

/// The backend IPs of Endpoints `web` as the edge's MetaServer serves it (from the cloud).
fn backends_seen(meta_server: &str) -> Option<Vec<String>> {
    let (status, body) = crate::support::process::http(
        meta_server,
        "GET",
        "/api/v1/namespaces/default/endpoints/web",
        "",
    )?;
    if status != 200 {
        return None;
    }
    let endpoints: Value = serde_json::from_str(&body).ok()?;
    let mut ips: Vec<String> = endpoints["subsets"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|subset| subset["addresses"].as_array().cloned().unwrap_or_default())
        .filter_map(|address| address["ip"].as_str().map(str::to_owned))
        .collect();
    ips.sort();
    Some(ips)
}

#[actix_rt::test]
async fn each_edge_reads_only_its_groups_backends_of_the_applications_service_through_its_metaserver(
) {
    let dir = tempfile::tempdir().unwrap();
    let standin = start_standin(dir.path(), 1000);
    let client = client(&standin.kubeconfig).await;
    let nodes: Api<Node> = Api::all(client.clone());
    for (node, zone) in [("edge-e", "east"), ("edge-w", "west")] {
        create_node(
            &nodes,
            node,
            json!({"node-role.kubernetes.io/edge": "", "zone": zone}),
        )
        .await;
    }
    let cloud = start_cloud(dir.path(), &standin.kubeconfig, "cloud");
    let groups = node_groups(&client);
    for zone in ["east", "west"] {
        groups
            .create(
                &PostParams::default(),
                &dynamic(json!({
                    "apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "NodeGroup",
                    "metadata": {"name": zone}, "spec": {"matchLabels": {"zone": zone}},
                })),
            )
            .await
            .unwrap();
    }
    label_becomes(&nodes, "edge-e", Some("east")).await;
    label_becomes(&nodes, "edge-w", Some("west")).await;
    applications(&client)
        .create(
            &PostParams::default(),
            &dynamic(application(json!([{"name": "east"}, {"name": "west"}]))),
        )
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    eventually("service web", WITHIN, || async {
        services.get_opt("web").await.ok()?
    })
    .await;
    // The stand-in has no endpoints controller: the test writes the Endpoints it would
    // (one backend on each edge).
    let endpoints: Api<k8s_openapi::api::core::v1::Endpoints> =
        Api::namespaced(client.clone(), "default");
    endpoints
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Endpoints",
                "metadata": {"name": "web", "namespace": "default"},
                "subsets": [{"addresses": [
                    {"ip": "10.0.0.1", "nodeName": "edge-e"},
                    {"ip": "10.0.0.2", "nodeName": "edge-w"}],
                    "ports": [{"port": 80}]}],
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let (_edge_e, meta_e) = start_edge_with_metaserver(dir.path(), "edge-e", &cloud.websocket);
    let (_edge_w, meta_w) = start_edge_with_metaserver(dir.path(), "edge-w", &cloud.websocket);
    for (meta, want) in [(&meta_e, "10.0.0.1"), (&meta_w, "10.0.0.2")] {
        let seen = eventually(&format!("{want} through {meta}"), WITHIN, || async {
            backends_seen(meta).filter(|ips| !ips.is_empty())
        })
        .await;
        assert_eq!(seen, [want], "only its group's backend");
    }
    drop(cloud.process);
}
