//! KubeEdge's node groups (docs/nodegroups.md): NodeGroups applied with `edgehive apply`
//! label the nodes they select with `apps.kubeedge.io/belonging-to`, follow nodes and groups
//! as they change, and report each node's readiness in their status.

use std::time::Duration;

use crate::support;

use edgehive::cloud::CloudProcess;
use edgehive::config::CloudConfig;
use edgehive_actors::cloud::cluster::EmbeddedCluster;
use serde_json::{json, Value};
use support::eventually;
use support::process::{http, spawn, wait_until, BIN};

const LABEL: &str = "apps.kubeedge.io/belonging-to";
const WITHIN: Duration = Duration::from_secs(30);

/// An in-process cloud on the embedded cluster with the NodeGroup controller on.
async fn start_cloud() -> CloudProcess {
    start_cloud_seeded(None).await
}

/// [`start_cloud`] with the embedded cluster seeded from the manifests in `manifests`.
async fn start_cloud_seeded(manifests: Option<&std::path::Path>) -> CloudProcess {
    let mut config = CloudConfig::default();
    config.modules.cloud_hub.websocket.address = "127.0.0.1".into();
    config.modules.cloud_hub.websocket.port = 0;
    config.modules.cloud_hub.websocket.insecure_plaintext = true;
    config.common_config.monitor_server.bind_address = "127.0.0.1:0".into();
    config.embedded_cluster.database = Default::default();
    config.modules.node_group_controller.enable = true;
    CloudProcess::start(&config, manifests).await.unwrap()
}

fn node(name: &str, labels: Value, ready: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    })
}

fn group(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "NodeGroup",
           "metadata": {"name": name}, "spec": spec})
}

fn label_of(cluster: &EmbeddedCluster, node: &str) -> Option<String> {
    let node = cluster.get("Node", None, node)?;
    node["metadata"]["labels"][LABEL]
        .as_str()
        .map(str::to_owned)
}

/// Waits until `node`'s belonging-to label is `want`.
async fn label_becomes(cluster: &EmbeddedCluster, node: &str, want: Option<&str>) {
    eventually(&format!("{node} labelled {want:?}"), WITHIN, || {
        let found = label_of(cluster, node);
        async move { (found.as_deref() == want).then_some(()) }
    })
    .await;
}

/// `(nodeName, readyStatus, selectionStatus)` of the group's status.
fn statuses(cluster: &EmbeddedCluster, name: &str) -> Vec<(String, String, String)> {
    let Some(group) = cluster.get("NodeGroup", None, name) else {
        return Vec::new();
    };
    group["status"]["nodeStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let field = |f: &str| s[f].as_str().unwrap_or_default().to_owned();
            (
                field("nodeName"),
                field("readyStatus"),
                field("selectionStatus"),
            )
        })
        .collect()
}

async fn statuses_become(cluster: &EmbeddedCluster, name: &str, want: &[(&str, &str, &str)]) {
    let want: Vec<(String, String, String)> = want
        .iter()
        .map(|(a, b, c)| ((*a).into(), (*b).into(), (*c).into()))
        .collect();
    eventually(&format!("status of {name} = {want:?}"), WITHIN, || {
        let found = statuses(cluster, name);
        let ok = found == want;
        async move { ok.then_some(()) }
    })
    .await;
}

#[actix_rt::test]
async fn a_group_by_names_and_a_group_by_labels_label_their_nodes_and_list_them_ready() {
    let cloud = start_cloud().await;
    let cluster = cloud.cluster().unwrap().clone();
    cluster.apply(node("n1", json!({}), "True")).unwrap();
    cluster
        .apply(node("n2", json!({"zone": "east"}), "False"))
        .unwrap();
    cluster
        .apply(node("n3", json!({"zone": "west"}), "True"))
        .unwrap();
    cluster
        .apply(group("named", json!({"nodes": ["n1", "ghost"]})))
        .unwrap();
    cluster
        .apply(group("east", json!({"matchLabels": {"zone": "east"}})))
        .unwrap();
    label_becomes(&cluster, "n1", Some("named")).await;
    label_becomes(&cluster, "n2", Some("east")).await;
    statuses_become(
        &cluster,
        "named",
        &[("ghost", "Unknown", "Failed"), ("n1", "Ready", "Succeeded")],
    )
    .await;
    statuses_become(&cluster, "east", &[("n2", "NotReady", "Succeeded")]).await;
    // A node no group selects gets no label.
    assert_eq!(label_of(&cluster, "n3"), None);
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_relabelled_node_moves_into_and_out_of_a_group() {
    let cloud = start_cloud().await;
    let cluster = cloud.cluster().unwrap().clone();
    cluster
        .apply(group("east", json!({"matchLabels": {"zone": "east"}})))
        .unwrap();
    cluster
        .apply(node("n1", json!({"zone": "west"}), "True"))
        .unwrap();
    statuses_become(&cluster, "east", &[]).await;
    // Into the group: its label now matches.
    cluster
        .apply(node("n1", json!({"zone": "east"}), "True"))
        .unwrap();
    label_becomes(&cluster, "n1", Some("east")).await;
    statuses_become(&cluster, "east", &[("n1", "Ready", "Succeeded")]).await;
    // Out again (the label the controller added is written back as the user left it).
    cluster
        .apply(node("n1", json!({"zone": "west", LABEL: "east"}), "True"))
        .unwrap();
    label_becomes(&cluster, "n1", None).await;
    statuses_become(&cluster, "east", &[]).await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_deleted_group_takes_its_label_off_its_nodes_and_a_group_that_also_wants_them_gets_them()
{
    let cloud = start_cloud().await;
    let cluster = cloud.cluster().unwrap().clone();
    cluster.apply(node("n1", json!({}), "True")).unwrap();
    cluster.apply(node("n2", json!({}), "True")).unwrap();
    cluster
        .apply(group("first", json!({"nodes": ["n1", "n2"]})))
        .unwrap();
    label_becomes(&cluster, "n1", Some("first")).await;
    label_becomes(&cluster, "n2", Some("first")).await;
    // A second group that wants n2 too is refused it while the first has it.
    cluster
        .apply(group("second", json!({"nodes": ["n2"]})))
        .unwrap();
    statuses_become(&cluster, "second", &[("n2", "Ready", "Failed")]).await;
    assert_eq!(label_of(&cluster, "n2").as_deref(), Some("first"));
    let reason = cluster.get("NodeGroup", None, "second").unwrap()["status"]["nodeStatuses"][0]
        ["selectionStatusReason"]
        .clone();
    assert_eq!(reason, "node already belongs to NodeGroup first");
    cluster.delete("NodeGroup", None, "first").unwrap();
    label_becomes(&cluster, "n1", None).await;
    label_becomes(&cluster, "n2", Some("second")).await;
    statuses_become(&cluster, "second", &[("n2", "Ready", "Succeeded")]).await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn the_status_readiness_follows_the_nodes_ready_condition() {
    let cloud = start_cloud().await;
    let cluster = cloud.cluster().unwrap().clone();
    cluster.apply(node("n1", json!({}), "True")).unwrap();
    cluster.apply(group("g", json!({"nodes": ["n1"]}))).unwrap();
    statuses_become(&cluster, "g", &[("n1", "Ready", "Succeeded")]).await;
    cluster
        .modify("Node", None, "n1", |node| {
            node["status"]["conditions"][0]["status"] = json!("False");
            Ok(())
        })
        .unwrap();
    statuses_become(&cluster, "g", &[("n1", "NotReady", "Succeeded")]).await;
    cluster
        .modify("Node", None, "n1", |node| {
            node["status"]["conditions"] = json!([]);
            Ok(())
        })
        .unwrap();
    statuses_become(&cluster, "g", &[("n1", "Unknown", "Succeeded")]).await;
    cluster.delete("Node", None, "n1").unwrap();
    statuses_become(&cluster, "g", &[("n1", "Unknown", "Failed")]).await;
    cloud.stop().await;
}

/// A cloud that starts on groups and labelled nodes (a restart) writes no label: nothing is
/// judged before both kinds are listed, so a node is never stripped of a group it belongs to.
#[actix_rt::test]
async fn a_cloud_starting_on_labelled_nodes_leaves_their_labels_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut manifests = Vec::new();
    for n in 0..50 {
        manifests.push(node(
            &format!("n{n}"),
            json!({"zone": "east", LABEL: "east"}),
            "True",
        ));
    }
    manifests.push(group("east", json!({"matchLabels": {"zone": "east"}})));
    std::fs::write(
        dir.path().join("seed.json"),
        serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": manifests}))
            .unwrap(),
    )
    .unwrap();
    let cloud = start_cloud_seeded(Some(dir.path())).await;
    let cluster = cloud.cluster().unwrap().clone();
    eventually("east's status lists its 50 nodes", WITHIN, || {
        let found = statuses(&cluster, "east");
        let ok = found.len() == 50
            && found
                .iter()
                .all(|(_, ready, sel)| ready == "Ready" && sel == "Succeeded");
        async move { ok.then_some(()) }
    })
    .await;
    let metrics = cloud.hive().metrics().encode();
    assert!(
        !metrics.contains("what=\"label\""),
        "labels were written: {metrics}"
    );
    assert!((0..50).all(|n| label_of(&cluster, &format!("n{n}")).as_deref() == Some("east")));
    cloud.stop().await;
}

/// `edgehive apply` (the real binary, against a real cloud process) takes a NodeGroup as the
/// cluster-scoped object it is, and the cloud's controller labels its node.
#[test]
fn edgehive_apply_takes_a_nodegroup_and_the_cloud_process_labels_its_node() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cloud.yaml");
    let yaml =
        support::process::plain_cloud_yaml(0, None) + "  nodeGroupController:\n    enable: true\n";
    std::fs::write(&config, yaml).unwrap();
    let (_cloud, banner) = spawn(&["cloud", "--config", config.to_str().unwrap()]);
    let admin = support::process::banner_field(&banner, "admin on http://", ' ').to_owned();
    let manifests = dir.path().join("group.yaml");
    std::fs::write(
        &manifests,
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: edge-1\n  labels:\n    site: lab\n---\n\
         apiVersion: apps.kubeedge.io/v1alpha1\nkind: NodeGroup\nmetadata:\n  name: lab\n\
         spec:\n  matchLabels:\n    site: lab\n",
    )
    .unwrap();
    let output = std::process::Command::new(BIN)
        .args([
            "apply",
            "-f",
            manifests.to_str().unwrap(),
            "--admin",
            &admin,
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("NodeGroup lab applied"), "{stdout}");
    wait_until("edge-1 labelled lab", WITHIN, || {
        let Some((200, body)) = http(&admin, "GET", "/api/v1/objects/nodes", "") else {
            return false;
        };
        let nodes: Value = serde_json::from_str(&body).unwrap();
        nodes["items"][0]["metadata"]["labels"][LABEL] == "lab"
    });
    let (status, body) = http(&admin, "GET", "/api/v1/objects/nodegroups", "").unwrap();
    assert_eq!(status, 200, "{body}");
    let groups: Value = serde_json::from_str(&body).unwrap();
    let lab = &groups["items"][0];
    // Cluster-scoped: no namespace.
    assert!(lab["metadata"]["namespace"].is_null(), "{lab}");
    wait_until("lab's status lists edge-1", WITHIN, || {
        let Some((200, body)) = http(&admin, "GET", "/api/v1/objects/nodegroups", "") else {
            return false;
        };
        let groups: Value = serde_json::from_str(&body).unwrap();
        groups["items"][0]["status"]["nodeStatuses"][0]["nodeName"] == "edge-1"
    });
}

/// The pod template spec of Deployment `name` in `default` once `want` holds of it, waiting
/// at most [`WITHIN`] (the controller follows each change of the application in its own
/// time, and a loaded machine may take long); at the deadline the last one seen, for the
/// caller's assertions to say what differs.
async fn template_once(
    cluster: &EmbeddedCluster,
    name: &str,
    want: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = std::time::Instant::now() + WITHIN;
    loop {
        let spec = cluster
            .get("Deployment", Some("default"), name)
            .map(|deployment| deployment["spec"]["template"]["spec"].clone());
        let late = std::time::Instant::now() >= deadline;
        match spec {
            Some(spec) if want(&spec) || late => return spec,
            None => assert!(!late, "Deployment {name} not made within {WITHIN:?}"),
            Some(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The EdgeApplication `shop`: Deployment and Service `web`, for `targets`.
pub(crate) fn application(targets: Value) -> Value {
    json!({
        "apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "EdgeApplication",
        "metadata": {"name": "shop", "namespace": "default"},
        "spec": {
            "workloadTemplate": {"manifests": [
                {"apiVersion": "apps/v1", "kind": "Deployment",
                 "metadata": {"name": "web", "labels": {"app": "web"}},
                 "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                          "template": {"metadata": {"labels": {"app": "web"}},
                                       "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}},
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                 "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}},
            ]},
            "workloadScope": {"targetNodeGroups": targets},
        },
    })
}

#[actix_rt::test]
async fn an_edgeapplication_makes_overridden_deployments_per_group_one_ranged_service_under_its_name_and_removes_them(
) {
    let cloud = start_cloud().await;
    let cluster = cloud.cluster().unwrap().clone();
    let app = cluster
        .apply(application(json!([
            {"name": "east", "overriders": {"replicas": 3, "imageOverriders": [
                {"component": "Tag", "operator": "replace", "value": "1.28"}]}},
            {"name": "west"},
        ])))
        .unwrap();
    let uid = app["metadata"]["uid"].as_str().unwrap().to_owned();
    let east = eventually("web-east", WITHIN, || {
        let found = cluster.get("Deployment", Some("default"), "web-east");
        async move { found }
    })
    .await;
    assert_eq!(east["spec"]["replicas"], 3);
    let pod = &east["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["image"], "nginx:1.28");
    assert_eq!(pod["nodeSelector"][LABEL], "east");
    assert_eq!(east["metadata"]["ownerReferences"][0]["uid"], uid.as_str());
    assert_eq!(
        east["metadata"]["ownerReferences"][0]["kind"],
        "EdgeApplication"
    );
    let west = eventually("web-west", WITHIN, || {
        let found = cluster.get("Deployment", Some("default"), "web-west");
        async move { found }
    })
    .await;
    assert_eq!(west["spec"]["replicas"], 1);
    assert_eq!(
        west["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx:1.27"
    );
    assert_eq!(
        west["spec"]["template"]["spec"]["nodeSelector"][LABEL],
        "west"
    );
    // The Service: one, under the manifest's own name (clients address `web` in every
    // group, as with KubeEdge v1.22), ranged to each node group by its annotation.
    let service = eventually("service web", WITHIN, || {
        let found = cluster.get("Service", Some("default"), "web");
        async move { found }
    })
    .await;
    assert_eq!(
        service["metadata"]["annotations"]["apps.kubeedge.io/service-topology"],
        "range-nodegroup"
    );
    assert_eq!(
        service["metadata"]["ownerReferences"][0]["uid"],
        uid.as_str()
    );
    assert_eq!(service["spec"]["selector"]["app"], "web");
    assert_eq!(cluster.count("Service", |_| true), 1);
    for group in ["east", "west"] {
        let name = format!("web-{group}");
        assert!(cluster.get("Service", Some("default"), &name).is_none());
    }
    // The status reports each of the three workloads (by manifest, then name, as KubeEdge).
    eventually("workloadStatus", WITHIN, || {
        let app = cluster
            .get("EdgeApplication", Some("default"), "shop")
            .unwrap();
        let statuses = app["status"]["workloadStatus"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let names: Vec<String> = statuses
            .iter()
            .filter(|s| s["conditions"] == "Available")
            .map(|s| {
                format!(
                    "{}/{}",
                    s["identifier"]["kind"].as_str().unwrap(),
                    s["identifier"]["name"].as_str().unwrap()
                )
            })
            .collect();
        async move {
            (names == ["Deployment/web-east", "Deployment/web-west", "Service/web"]).then_some(())
        }
    })
    .await;
    // A group no longer targeted loses its Deployment (the one Service stays, for the groups
    // left); an override changed is applied.
    cluster
        .apply(application(
            json!([{"name": "east", "overriders": {"replicas": 2}}]),
        ))
        .unwrap();
    eventually("web-west gone and web-east at 2 replicas", WITHIN, || {
        let west = cluster.get("Deployment", Some("default"), "web-west");
        let service = cluster.get("Service", Some("default"), "web");
        let east = cluster.get("Deployment", Some("default"), "web-east");
        async move {
            (west.is_none()
                && service.is_some()
                && east.is_some_and(|e| {
                    e["spec"]["replicas"] == 2
                        && e["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.27"
                }))
            .then_some(())
        }
    })
    .await;
    // Deleting the application deletes what it owned.
    cluster
        .delete("EdgeApplication", Some("default"), "shop")
        .unwrap();
    eventually("web-east gone", WITHIN, || {
        let left = cluster.count("Deployment", |_| true) + cluster.count("Service", |_| true);
        async move { (left == 0).then_some(()) }
    })
    .await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn an_edgeapplications_env_command_args_and_resources_overriders_reach_each_groups_deployment(
) {
    let cloud = start_cloud().await;
    let cluster = cloud.cluster().unwrap().clone();
    let mut app = application(json!([
        {"name": "east", "overriders": {
            "envOverriders": [
                {"containerName": "web", "operator": "replace", "value": [{"name": "REGION", "value": "east"}]},
                {"containerName": "web", "operator": "remove", "value": [{"name": "DEBUG"}]}],
            "commandOverriders": [{"containerName": "web", "operator": "add", "value": ["--tls"]}],
            "argsOverriders": [{"containerName": "web", "operator": "remove", "value": ["-v"]}],
            "resourcesOverriders": [{"containerName": "web",
                "value": {"limits": {"cpu": "250m"}, "requests": {"memory": "32Mi"}}}]}},
        {"name": "west", "overriders": {
            "envOverriders": [{"containerName": "web", "operator": "add", "value": [{"name": "EXTRA", "value": "1"}]}]}},
    ]));
    let template = &mut app["spec"]["workloadTemplate"]["manifests"][0]["spec"]["template"]["spec"];
    template["nodeSelector"] = json!({"kubernetes.io/arch": "arm64"});
    template["containers"][0]["command"] = json!(["nginx"]);
    template["containers"][0]["args"] = json!(["-g", "daemon off;", "-v"]);
    template["containers"][0]["env"] =
        json!([{"name": "REGION", "value": "any"}, {"name": "DEBUG", "value": "1"}]);
    cluster.apply(app.clone()).unwrap();
    let east_spec = |spec: &Value| {
        let web = &spec["containers"][0];
        web["env"] == json!([{"name": "REGION", "value": "east"}])
            && web["command"] == json!(["nginx", "--tls"])
            && web["args"] == json!(["-g", "daemon off;"])
            && web["resources"]
                == json!({"limits": {"cpu": "250m"}, "requests": {"memory": "32Mi"}})
            // KubeEdge's node selector overrider: the group's label is the whole selector.
            && spec["nodeSelector"] == json!({LABEL: "east"})
    };
    let east = template_once(&cluster, "web-east", east_spec).await;
    let web = &east["containers"][0];
    assert_eq!(web["env"], json!([{"name": "REGION", "value": "east"}]));
    assert_eq!(web["command"], json!(["nginx", "--tls"]));
    assert_eq!(web["args"], json!(["-g", "daemon off;"]));
    assert_eq!(
        web["resources"],
        json!({"limits": {"cpu": "250m"}, "requests": {"memory": "32Mi"}})
    );
    assert_eq!(east["nodeSelector"], json!({LABEL: "east"}));
    let west_env = json!([{"name": "REGION", "value": "any"}, {"name": "DEBUG", "value": "1"},
        {"name": "EXTRA", "value": "1"}]);
    let west_spec = |spec: &Value| {
        let web = &spec["containers"][0];
        web["env"] == west_env
            && web["args"] == json!(["-g", "daemon off;", "-v"])
            && web.get("resources").is_none()
    };
    let west = template_once(&cluster, "web-west", west_spec).await;
    let web = &west["containers"][0];
    assert_eq!(web["env"], west_env);
    assert_eq!(web["args"], json!(["-g", "daemon off;", "-v"]));
    assert!(web.get("resources").is_none(), "{web}");

    // An overrider changed: the Deployment follows (its env overrider gone, the template's
    // env again).
    app["spec"]["workloadScope"]["targetNodeGroups"][1]["overriders"] = json!({
        "argsOverriders": [{"containerName": "web", "operator": "add", "value": ["--west"]}]});
    cluster.apply(app).unwrap();
    let template_env = json!([{"name": "REGION", "value": "any"}, {"name": "DEBUG", "value": "1"}]);
    let changed = |spec: &Value| {
        let web = &spec["containers"][0];
        web["args"] == json!(["-g", "daemon off;", "-v", "--west"]) && web["env"] == template_env
    };
    let west = template_once(&cluster, "web-west", changed).await;
    let web = &west["containers"][0];
    assert_eq!(web["args"], json!(["-g", "daemon off;", "-v", "--west"]));
    assert_eq!(web["env"], template_env);
    // East's Deployment is left as it was.
    let east = template_once(&cluster, "web-east", east_spec).await;
    assert!(east_spec(&east), "{east}");
    cloud.stop().await;
}

/// The refusals of `reason` the cloud counted.
fn refusals(cloud: &CloudProcess, reason: &str) -> u64 {
    support::metric_sum(
        &cloud.hive().metrics().encode(),
        &format!("edgehive_nodegroupcontroller_refused_total{{reason=\"{reason}\"}}"),
    )
}

/// The application's `workloadStatus` as `kind/name conditions` (ordinal order).
fn workload_statuses(cluster: &EmbeddedCluster, name: &str) -> Vec<String> {
    let app = cluster.get("EdgeApplication", Some("default"), name);
    app.and_then(|app| app["status"]["workloadStatus"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|s| {
            format!(
                "{} {}/{} {}",
                s["identifier"]["ordinal"],
                s["identifier"]["kind"].as_str().unwrap_or_default(),
                s["identifier"]["name"].as_str().unwrap_or_default(),
                s["conditions"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

#[actix_rt::test]
async fn an_edgeapplications_configmap_daemonset_statefulset_and_job_are_made_once_and_other_kinds_refused(
) {
    let cloud = start_cloud().await;
    let cluster = cloud.cluster().unwrap().clone();
    let manifests = |config: &str, extra: Value| {
        let mut manifests = vec![
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
                   "data": {"mode": config}}),
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
                   "spec": {"selector": {"matchLabels": {"app": "agent"}},
                            "template": {"metadata": {"labels": {"app": "agent"}},
                                         "spec": {"containers": [{"name": "a", "image": "agent:1"}]}}}}),
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
                   "spec": {"serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                            "template": {"metadata": {"labels": {"app": "db"}},
                                         "spec": {"containers": [{"name": "d", "image": "db:1"}]}}}}),
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "setup"},
                   "spec": {"template": {"spec": {"restartPolicy": "Never",
                            "containers": [{"name": "s", "image": "setup:1"}]}}}}),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token"},
                   "stringData": {"t": "x"}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": "everything"}}),
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "elsewhere", "namespace": "kube-system"}}),
        ];
        manifests.extend(extra.as_array().cloned().unwrap_or_default());
        json!({
            "apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "EdgeApplication",
            "metadata": {"name": "kit", "namespace": "default"},
            "spec": {
                "workloadTemplate": {"manifests": manifests},
                "workloadScope": {"targetNodeGroups": [
                    {"name": "east", "overriders": {"replicas": 3,
                        "imageOverriders": [{"component": "Tag", "operator": "replace", "value": "9"}]}},
                    {"name": "west"},
                ]},
            },
        })
    };
    let app = cluster.apply(manifests("a", Value::Null)).unwrap();
    let uid = app["metadata"]["uid"].as_str().unwrap().to_owned();
    // Each made once, under its own name, owned by the application, without the group
    // overrides (KubeEdge overrides Deployments alone).
    for (kind, name) in [
        ("ConfigMap", "settings"),
        ("DaemonSet", "agent"),
        ("StatefulSet", "db"),
        ("Job", "setup"),
    ] {
        let made = eventually(&format!("{kind} {name}"), WITHIN, || {
            let found = cluster.get(kind, Some("default"), name);
            async move { found }
        })
        .await;
        assert_eq!(made["metadata"]["ownerReferences"][0]["uid"], uid.as_str());
        assert_eq!(cluster.count(kind, |_| true), 1, "{kind} made once");
        let pod = &made["spec"]["template"]["spec"];
        assert!(pod["nodeSelector"].is_null(), "{kind}: {made}");
        if let Some(image) = pod["containers"][0]["image"].as_str() {
            assert!(image.ends_with(":1"), "{kind} overridden: {image}");
        }
    }
    // Refused: never made, each counted once, an Event on the application says why, and the
    // status has an entry for every manifest.
    eventually("refusals counted", WITHIN, || {
        let counted = (refusals(&cloud, "kind"), refusals(&cloud, "namespace"));
        async move { (counted == (2, 1)).then_some(()) }
    })
    .await;
    assert!(cluster.get("Secret", Some("default"), "token").is_none());
    assert!(cluster.get("ClusterRole", None, "everything").is_none());
    assert!(cluster
        .get("ConfigMap", Some("kube-system"), "elsewhere")
        .is_none());
    let events = || {
        let mut messages: Vec<String> = cluster
            .list("Event")
            .0
            .iter()
            .filter(|e| {
                e["reason"] == "ManifestRefused" && e["involvedObject"]["uid"] == uid.as_str()
            })
            .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
            .collect();
        messages.sort();
        messages
    };
    let said = events();
    assert_eq!(said.len(), 3, "{said:?}");
    assert!(
        said[0].starts_with("manifest 4 (v1 Secret \"token\")"),
        "{said:?}"
    );
    assert!(said[1].contains("ClusterRole"), "{said:?}");
    assert!(said[2].contains("kube-system"), "{said:?}");
    let want = [
        "0 ConfigMap/settings Available",
        "1 DaemonSet/agent Available",
        "2 StatefulSet/db Available",
        "3 Job/setup Available",
        "4 Secret/token Processing",
        "5 ClusterRole/everything Processing",
        "6 ConfigMap/elsewhere Processing",
    ];
    eventually("workloadStatus", WITHIN, || {
        let got = workload_statuses(&cluster, "kit");
        async move { (got == want).then_some(()) }
    })
    .await;
    // Sent again (the same manifests, another write of the application): not counted again.
    let mut again = manifests("a", Value::Null);
    again["metadata"]["labels"] = json!({"touched": "1"});
    cluster.apply(again).unwrap();
    // A changed manifest is written; a new refusal (another form: an old apiVersion, no
    // name) is counted, the old ones are not.
    cluster
        .apply(manifests(
            "b",
            json!([
                {"apiVersion": "extensions/v1beta1", "kind": "Deployment", "metadata": {"name": "old"}},
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}},
            ]),
        ))
        .unwrap();
    eventually("settings updated", WITHIN, || {
        let found = cluster
            .get("ConfigMap", Some("default"), "settings")
            .filter(|c| c["data"]["mode"] == "b");
        async move { found }
    })
    .await;
    eventually("new refusals counted", WITHIN, || {
        let counted = (
            refusals(&cloud, "api_version"),
            refusals(&cloud, "name"),
            refusals(&cloud, "kind"),
            refusals(&cloud, "namespace"),
        );
        async move { (counted == (1, 1, 2, 1)).then_some(()) }
    })
    .await;
    assert_eq!(events().len(), 5);
    assert!(cluster.get("Deployment", Some("default"), "old").is_none());
    assert_eq!(cluster.count("Deployment", |_| true), 0);
    // Deleting the application deletes what it made.
    cluster
        .delete("EdgeApplication", Some("default"), "kit")
        .unwrap();
    eventually("its workloads gone", WITHIN, || {
        let left: usize = ["ConfigMap", "DaemonSet", "StatefulSet", "Job"]
            .iter()
            .map(|kind| cluster.count(kind, |_| true))
            .sum();
        async move { (left == 0).then_some(()) }
    })
    .await;
    cloud.stop().await;
}

/// KubeEdge's name suffix of a `targetNodeLabels` Deployment: `ls-` and the first four bytes
/// of SHA-256 over the selector's labels, key then value, keys sorted.
fn label_suffix(labels: &[(&str, &str)]) -> String {
    let mut sorted = labels.to_vec();
    sorted.sort();
    let text: String = sorted.iter().map(|(k, v)| format!("{k}{v}")).collect();
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let hex: String = digest.as_ref()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("ls-{hex}")
}

fn two_container_application(scope: Value) -> Value {
    json!({
        "apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "EdgeApplication",
        "metadata": {"name": "shop", "namespace": "default"},
        "spec": {
            "workloadTemplate": {"manifests": [
                {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                 "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                          "template": {"metadata": {"labels": {"app": "web"}},
                                       "spec": {"nodeSelector": {"disk": "ssd"},
                                                "containers": [{"name": "web", "image": "nginx:1.27"},
                                                               {"name": "log", "image": "fluentbit:3"}]}}}},
            ]},
            "workloadScope": scope,
        },
    })
}

#[actix_rt::test]
async fn target_node_labels_make_a_deployment_per_selector_placed_by_node_affinity_and_named_as_kubeedge_names_it(
) {
    let cloud = start_cloud().await;
    let cluster = cloud.cluster().unwrap().clone();
    let app = cluster
        .apply(two_container_application(json!({
            "targetNodeGroups": [{"name": "east"}],
            "targetNodeLabels": [
                {"labelSelector": {"matchLabels": {"zone": "north", "arch": "arm64"}},
                 "overriders": {"replicas": 2, "imageOverriders": [
                     {"component": "Registry", "operator": "replace", "value": "mirror.example"}]}},
            ],
        })))
        .unwrap();
    let uid = app["metadata"]["uid"].as_str().unwrap().to_owned();
    let name = format!(
        "web-{}",
        label_suffix(&[("zone", "north"), ("arch", "arm64")])
    );
    let made = eventually(&name, WITHIN, || {
        let found = cluster.get("Deployment", Some("default"), &name);
        async move { found }
    })
    .await;
    assert_eq!(made["spec"]["replicas"], 2);
    assert_eq!(made["metadata"]["ownerReferences"][0]["uid"], uid.as_str());
    let pod = &made["spec"]["template"]["spec"];
    // Placed on the nodes with both labels; the manifest's own node selector is kept (as
    // KubeEdge keeps it), and no group label is asked for.
    assert_eq!(
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"],
        json!([{"matchExpressions": [
            {"key": "arch", "operator": "In", "values": ["arm64"]},
            {"key": "zone", "operator": "In", "values": ["north"]}]}])
    );
    assert_eq!(pod["nodeSelector"], json!({"disk": "ssd"}));
    assert_eq!(pod["containers"][0]["image"], "mirror.example/nginx:1.27");
    assert_eq!(pod["containers"][1]["image"], "mirror.example/fluentbit:3");
    // The group's Deployment is made beside it, as before.
    let east = template_once(&cluster, "web-east", |_| true).await;
    assert_eq!(east["nodeSelector"], json!({LABEL: "east"}));
    assert!(east["affinity"].is_null());
    eventually("workloadStatus of both", WITHIN, || {
        let got = workload_statuses(&cluster, "shop");
        let want = vec![
            "0 Deployment/web-east Available".to_owned(),
            format!("0 Deployment/{name} Available"),
        ];
        async move { (got == want).then_some(()) }
    })
    .await;
    // The selector dropped: its Deployment goes; the group's stays.
    cluster
        .apply(two_container_application(
            json!({"targetNodeGroups": [{"name": "east"}]}),
        ))
        .unwrap();
    eventually("the selector's Deployment gone", WITHIN, || {
        let gone = cluster.get("Deployment", Some("default"), &name).is_none();
        let east = cluster.get("Deployment", Some("default"), "web-east");
        async move { (gone && east.is_some()).then_some(()) }
    })
    .await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn an_image_predicate_changes_only_the_image_it_names_and_a_predicate_or_selector_out_of_bounds_is_refused_and_counted(
) {
    let cloud = start_cloud().await;
    let cluster = cloud.cluster().unwrap().clone();
    let tag = |path: &str| {
        json!({"imageOverriders": [{"component": "Tag", "operator": "replace", "value": "9",
                                    "predicate": {"path": path}}]})
    };
    let scope = |west_path: &str, selector: Value| {
        json!({
            "targetNodeGroups": [
                {"name": "east", "overriders": tag("/spec/template/spec/containers/1/image")},
                {"name": "west", "overriders": tag(west_path)},
            ],
            "targetNodeLabels": [{"labelSelector": selector, "overriders": {}}],
        })
    };
    // West's predicate names the object's namespace (an "image" override would move the
    // Deployment into kube-system); the selector's operator is not a node selector's.
    cluster
        .apply(two_container_application(scope(
            "/metadata/namespace",
            json!({"matchExpressions": [{"key": "zone", "operator": "Gt", "values": ["1"]}]}),
        )))
        .unwrap();
    let east = template_once(&cluster, "web-east", |_| true).await;
    assert_eq!(east["containers"][0]["image"], "nginx:1.27", "not named");
    assert_eq!(east["containers"][1]["image"], "fluentbit:9");
    eventually("both refusals counted", WITHIN, || {
        let counted = (
            refusals(&cloud, "predicate"),
            refusals(&cloud, "label_selector"),
        );
        async move { (counted == (1, 1)).then_some(()) }
    })
    .await;
    eventually("workloadStatus", WITHIN, || {
        let got = workload_statuses(&cluster, "shop");
        async move {
            (got == [
                "0 Deployment/web Processing",
                "0 Deployment/web-east Available",
                "0 Deployment/web-west Processing",
            ])
            .then_some(())
        }
    })
    .await;
    // Nothing made for them, here or in kube-system: only east's Deployment exists.
    assert_eq!(cluster.count("Deployment", |_| true), 1);
    let said: Vec<String> = cluster
        .list("Event")
        .0
        .iter()
        .filter(|e| e["reason"] == "ManifestRefused")
        .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(
        said.iter()
            .any(|m| m.contains("targetNodeGroups[1] (west)") && m.contains("/metadata/namespace")),
        "{said:?}"
    );
    assert!(
        said.iter()
            .any(|m| m.contains("targetNodeLabels[0]") && m.contains("\"Gt\"")),
        "{said:?}"
    );
    // Sent again (another write of the same application): not counted again. In other forms
    // (an index past the containers, an empty selector): counted again, still not made.
    let mut again = two_container_application(scope(
        "/metadata/namespace",
        json!({"matchExpressions": [{"key": "zone", "operator": "Gt", "values": ["1"]}]}),
    ));
    again["metadata"]["labels"] = json!({"touched": "1"});
    cluster.apply(again).unwrap();
    cluster
        .apply(two_container_application(scope(
            "/spec/template/spec/containers/7/image",
            json!({}),
        )))
        .unwrap();
    eventually("the other forms counted", WITHIN, || {
        let counted = (
            refusals(&cloud, "predicate"),
            refusals(&cloud, "label_selector"),
        );
        async move { (counted == (2, 2)).then_some(()) }
    })
    .await;
    assert_eq!(cluster.count("Deployment", |_| true), 1);
    // Fixed: west's predicate names its first container and the selector is a good one.
    cluster
        .apply(two_container_application(scope(
            "/spec/template/spec/containers/0/image",
            json!({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}),
        )))
        .unwrap();
    let west = template_once(&cluster, "web-west", |_| true).await;
    assert_eq!(west["containers"][0]["image"], "nginx:9");
    assert_eq!(west["containers"][1]["image"], "fluentbit:3");
    eventually("three Deployments", WITHIN, || {
        let n = cluster.count("Deployment", |_| true);
        async move { (n == 3).then_some(()) }
    })
    .await;
    assert_eq!(
        (
            refusals(&cloud, "predicate"),
            refusals(&cloud, "label_selector")
        ),
        (2, 2)
    );
    cloud.stop().await;
}
