//! The service-topology filter (issue 27, docs/nodegroups.md) as edges see it: nodes
//! connected over mutual TLS to a running cloud (embedded cluster) list, get and watch
//! Endpoints and EndpointSlices through DynamicController (the one path by which they reach
//! edges), and a Service annotated `apps.kubeedge.io/service-topology: range-nodegroup`
//! shows each node only the backends on nodes of its group (`apps.kubeedge.io/belonging-to`),
//! also after a node changes group or a backend moves. Before the filter, every node got
//! every backend. The Service an EdgeApplication makes is that one Service, under its own
//! name, for every group (as KubeEdge v1.22's), not a Service per group.

use crate::dynamiccontroller::{
    answer_to, application, ask, body, connect, metrics, start, until_push,
};
use crate::support::*;
use crate::tls_join::{send, Socket};

use edgehive_actors::cloud::cluster::EmbeddedCluster;
use edgehive_protocols::application::{Application, ApplicationStatus, Verb};
use edgehive_protocols::{Message, Operation};
use serde_json::{json, Value};

const BELONGING_TO: &str = "apps.kubeedge.io/belonging-to";

fn node(name: &str, group: Option<&str>) -> Value {
    let mut node = edge_node(name);
    if let Some(group) = group {
        node["metadata"]["labels"][BELONGING_TO] = json!(group);
    }
    node
}

fn service(name: &str, ranged: bool) -> Value {
    let mut service = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"ports": [{"port": 80}]}});
    if ranged {
        service["metadata"]["annotations"] =
            json!({"apps.kubeedge.io/service-topology": "range-nodegroup"});
    }
    service
}

/// The IP of the backend on `node`: 10.0.0.<index of the node>.
fn ip(node: &str) -> String {
    let index = ["a1", "a2", "b1", "b2", "loose"]
        .iter()
        .position(|n| *n == node)
        .unwrap();
    format!("10.0.0.{index}")
}

/// Endpoints `name` with one backend per `(node, by_pod)`: `nodeName`, or (by_pod) only a
/// `targetRef` to pod `pod-<node>`.
fn endpoints(name: &str, backends: &[(&str, bool)]) -> Value {
    let addresses: Vec<Value> = backends
        .iter()
        .map(|(node, by_pod)| {
            if *by_pod {
                json!({"ip": ip(node), "targetRef": {"kind": "Pod", "namespace": "default", "name": format!("pod-{node}")}})
            } else {
                json!({"ip": ip(node), "nodeName": node})
            }
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": name, "namespace": "default"},
        "subsets": [{"addresses": addresses, "ports": [{"port": 80}]}]})
}

fn slice(service: &str, nodes: &[&str]) -> Value {
    let endpoints: Vec<Value> = nodes
        .iter()
        .map(|node| json!({"addresses": [ip(node)], "nodeName": node, "conditions": {"ready": true}}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-abc"), "namespace": "default",
            "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4", "endpoints": endpoints})
}

/// Every backend IP an Endpoints or EndpointSlice object lists, sorted.
fn ips(obj: &Value) -> Vec<String> {
    let mut ips: Vec<String> = Vec::new();
    for subset in obj["subsets"].as_array().into_iter().flatten() {
        for field in ["addresses", "notReadyAddresses"] {
            for address in subset[field].as_array().into_iter().flatten() {
                ips.push(address["ip"].as_str().unwrap().to_owned());
            }
        }
    }
    for endpoint in obj["endpoints"].as_array().into_iter().flatten() {
        for address in endpoint["addresses"].as_array().into_iter().flatten() {
            ips.push(address.as_str().unwrap().to_owned());
        }
    }
    ips.sort();
    ips
}

fn ips_of(nodes: &[&str]) -> Vec<String> {
    let mut ips: Vec<String> = nodes.iter().map(|n| ip(n)).collect();
    ips.sort();
    ips
}

/// The list's item `name`.
fn item<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|item| item["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

async fn list(socket: &mut Socket, node: &str, plural: &str) -> Value {
    let key = if plural == "endpointslices" {
        "/discovery.k8s.io/v1/endpointslices/default/null".to_owned()
    } else {
        format!("/core/v1/{plural}/default/null")
    };
    body(&ask(socket, &application(node, Verb::List, &key, json!({}))).await)
}

/// Registers a watch of `key`; pushes read meanwhile are kept in `seen`.
async fn watch(socket: &mut Socket, seen: &mut Vec<Message>, node: &str, key: &str) {
    let watch = application(node, Verb::Watch, key, json!({"watch": true}));
    send(socket, &watch).await;
    let answer = answer_to(socket, &watch, seen).await;
    let app: Application = serde_json::from_value(answer.content).unwrap();
    assert_eq!(app.status, ApplicationStatus::Approved);
}

/// The next push of `resource` whose backends are `want` (within [`WITHIN`]).
async fn push_with(
    socket: &mut Socket,
    seen: &mut Vec<Message>,
    resource: &str,
    want: &[&str],
) -> Message {
    let want = ips_of(want);
    until_push(socket, seen, |m| {
        m.resource() == resource && ips(&m.content) == want
    })
    .await
}

#[actix_rt::test]
async fn an_edge_gets_only_its_groups_backends_of_a_range_nodegroup_service_also_after_a_node_changes_group(
) {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start(dir.path(), |_| {}).await;
    let cluster = cloud.cluster().unwrap().clone();
    for (name, group) in [
        ("a1", Some("a")),
        ("a2", Some("a")),
        ("b1", Some("b")),
        ("b2", Some("b")),
        ("loose", None),
    ] {
        cluster.apply(node(name, group)).unwrap();
    }
    cluster.apply(pod("pod-b2", "b2")).unwrap();
    cluster.apply(service("web", true)).unwrap();
    cluster.apply(service("plain", false)).unwrap();
    // b2's backend names only its pod (targetRef), as a hand-written Endpoints may.
    cluster
        .apply(endpoints(
            "web",
            &[("a1", false), ("a2", false), ("b1", false), ("b2", true)],
        ))
        .unwrap();
    cluster
        .apply(endpoints("plain", &[("a1", false), ("b1", false)]))
        .unwrap();
    cluster.apply(slice("web", &["a1", "b1"])).unwrap();

    let mut a1 = connect(&cloud, dir.path(), "a1").await;
    let mut b1 = connect(&cloud, dir.path(), "b1").await;
    let mut loose = connect(&cloud, dir.path(), "loose").await;

    // Lists and gets: each node its group's backends; the Service without the annotation
    // whole; a node in no group none of the grouped nodes' backends.
    let listed = list(&mut a1, "a1", "endpoints").await;
    assert_eq!(ips(item(&listed, "web")), ips_of(&["a1", "a2"]));
    assert_eq!(ips(item(&listed, "plain")), ips_of(&["a1", "b1"]));
    let listed = list(&mut b1, "b1", "endpoints").await;
    assert_eq!(ips(item(&listed, "web")), ips_of(&["b1", "b2"]));
    let listed = list(&mut loose, "loose", "endpoints").await;
    assert_eq!(ips(item(&listed, "web")), Vec::<String>::new());
    assert_eq!(ips(item(&listed, "plain")), ips_of(&["a1", "b1"]));
    let slices = list(&mut a1, "a1", "endpointslices").await;
    assert_eq!(ips(item(&slices, "web-abc")), ips_of(&["a1"]));
    let slices = list(&mut b1, "b1", "endpointslices").await;
    assert_eq!(ips(item(&slices, "web-abc")), ips_of(&["b1"]));
    let got = body(
        &ask(
            &mut b1,
            &application("b1", Verb::Get, "/core/v1/endpoints/default/web", json!({})),
        )
        .await,
    );
    assert_eq!(ips(&got), ips_of(&["b1", "b2"]));

    // Watches: the current objects, filtered.
    let (mut seen_a, mut seen_b) = (Vec::new(), Vec::new());
    for (socket, seen, node) in [(&mut a1, &mut seen_a, "a1"), (&mut b1, &mut seen_b, "b1")] {
        watch(socket, seen, node, "/core/v1/endpoints/null/null").await;
        watch(
            socket,
            seen,
            node,
            "/discovery.k8s.io/v1/endpointslices/null/null",
        )
        .await;
    }
    push_with(&mut a1, &mut seen_a, "default/endpoints/web", &["a1", "a2"]).await;
    push_with(
        &mut a1,
        &mut seen_a,
        "default/endpointslice/web-abc",
        &["a1"],
    )
    .await;
    push_with(&mut b1, &mut seen_b, "default/endpoints/web", &["b1", "b2"]).await;

    // a2 moves to group b (its label changes; the Endpoints do not): both groups' watchers
    // are sent the corrected view, as a MODIFIED (update) of the same object.
    cluster.apply(node("a2", Some("b"))).unwrap();
    let fixed = push_with(&mut a1, &mut seen_a, "default/endpoints/web", &["a1"]).await;
    assert_eq!(fixed.operation(), Some(&Operation::Update));
    let fixed = push_with(
        &mut b1,
        &mut seen_b,
        "default/endpoints/web",
        &["a2", "b1", "b2"],
    )
    .await;
    assert_eq!(fixed.operation(), Some(&Operation::Update));
    // And a list now says the same.
    let listed = list(&mut a1, "a1", "endpoints").await;
    assert_eq!(ips(item(&listed, "web")), ips_of(&["a1"]));

    // A backend moves (its pod rescheduled from b1 to a1: the Endpoints change).
    let mut moved = endpoints("web", &[("a1", false), ("a2", false), ("b2", true)]);
    moved["subsets"][0]["addresses"]
        .as_array_mut()
        .unwrap()
        .push(json!({"ip": "10.0.0.99", "nodeName": "a1"}));
    cluster.apply(moved).unwrap();
    let update = until_push(&mut a1, &mut seen_a, |m| {
        m.resource() == "default/endpoints/web" && ips(&m.content).contains(&"10.0.0.99".into())
    })
    .await;
    assert_eq!(ips(&update.content), vec!["10.0.0.0", "10.0.0.99"]);
    push_with(&mut b1, &mut seen_b, "default/endpoints/web", &["a2", "b2"]).await;
    // A change of group a's backends only (a1's goes): b1's view is the same, so b1 is not
    // sent it (counted unchanged); a1 is.
    let before = metric_sum(
        &metrics(&cloud).await,
        "edgehive_dynamiccontroller_topology_views_total{outcome=\"unchanged\"}",
    );
    cluster
        .apply(endpoints("web", &[("a2", false), ("b2", true)]))
        .unwrap();
    push_with(&mut a1, &mut seen_a, "default/endpoints/web", &[]).await;
    eventually("b1's unchanged view counted", WITHIN, || async {
        let text = metrics(&cloud).await;
        let now = metric_sum(
            &text,
            "edgehive_dynamiccontroller_topology_views_total{outcome=\"unchanged\"}",
        );
        (now > before).then_some(())
    })
    .await;

    // Nothing a1 was sent while the annotation held named a backend of group b.
    for pushed in &seen_a {
        if pushed.resource() == "default/endpoints/web" {
            for other in ["b1", "b2"] {
                assert!(
                    !ips(&pushed.content).contains(&ip(other)),
                    "a1 was sent {other}'s backend: {:?}",
                    pushed.content
                );
            }
        }
    }

    // The annotation removed: every backend again (a2's and b2's), for both.
    cluster.apply(service("web", false)).unwrap();
    let whole = until_push(&mut b1, &mut seen_b, |m| {
        m.resource() == "default/endpoints/web" && ips(&m.content).len() == 2
    })
    .await;
    assert_eq!(whole.operation(), Some(&Operation::Update));

    let text = metrics(&cloud).await;
    for outcome in ["filtered", "corrected"] {
        let line =
            format!("edgehive_dynamiccontroller_topology_views_total{{outcome=\"{outcome}\"}}");
        assert!(metric_sum(&text, &line) >= 1, "{outcome}: {text}");
    }
    assert!(
        metric_sum(
            &text,
            "edgehive_dynamiccontroller_topology_backends_dropped"
        ) >= 3
    );
}

#[actix_rt::test]
async fn endpoints_whose_service_is_not_known_yet_are_sent_once_it_is_and_then_filtered() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start(dir.path(), |_| {}).await;
    let cluster = cloud.cluster().unwrap().clone();
    for (name, group) in [("a1", Some("a")), ("b1", Some("b"))] {
        cluster.apply(node(name, group)).unwrap();
    }
    let mut a1 = connect(&cloud, dir.path(), "a1").await;
    let mut seen = Vec::new();
    watch(&mut a1, &mut seen, "a1", "/core/v1/endpoints/null/null").await;
    // The Endpoints before their Service: not sent (no group is known to keep them to).
    cluster
        .apply(endpoints("late", &[("a1", false), ("b1", false)]))
        .unwrap();
    let listed = list(&mut a1, "a1", "endpoints").await;
    assert!(listed["items"].as_array().unwrap().is_empty(), "{listed}");
    cluster.apply(service("late", true)).unwrap();
    let first = push_with(&mut a1, &mut seen, "default/endpoints/late", &["a1"]).await;
    assert_eq!(first.operation(), Some(&Operation::Insert));
    assert!(
        !seen
            .iter()
            .any(|m| m.resource() == "default/endpoints/late" && ips(&m.content).len() > 1),
        "the whole object was pushed: {seen:?}"
    );
}

/// Endpoints `web` with a backend per `(ip, node)`.
fn web_at(backends: &[(&str, &str)]) -> Value {
    let addresses: Vec<Value> = backends
        .iter()
        .map(|(ip, node)| json!({"ip": ip, "nodeName": node}))
        .collect();
    json!({"apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "web", "namespace": "default"},
        "subsets": [{"addresses": addresses, "ports": [{"port": 80}]}]})
}

/// The next push of Endpoints `web` listing exactly `want`.
async fn web_push(socket: &mut Socket, seen: &mut Vec<Message>, want: &[&str]) -> Message {
    let mut want: Vec<String> = want.iter().map(|ip| ip.to_string()).collect();
    want.sort();
    until_push(socket, seen, |m| {
        m.resource() == "default/endpoints/web" && ips(&m.content) == want
    })
    .await
}

#[actix_rt::test]
async fn a_node_that_changes_group_gets_its_new_groups_endpoint_changes_not_its_old_groups_and_a_new_watch_sees_its_new_group(
) {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start(dir.path(), |_| {}).await;
    let cluster = cloud.cluster().unwrap().clone();
    for (name, group) in [("a1", "a"), ("a2", "a"), ("b1", "b"), ("b2", "b")] {
        cluster.apply(node(name, Some(group))).unwrap();
    }
    cluster.apply(service("web", true)).unwrap();
    cluster
        .apply(web_at(&[("10.1.0.1", "a1"), ("10.2.0.1", "b1")]))
        .unwrap();
    cluster.apply(slice("web", &["a1", "b1"])).unwrap();
    // a1 and a2 watch as group a, b2 as group b.
    let mut a1 = connect(&cloud, dir.path(), "a1").await;
    let mut a2 = connect(&cloud, dir.path(), "a2").await;
    let mut b2 = connect(&cloud, dir.path(), "b2").await;
    let (mut seen_a1, mut seen_a2, mut seen_b2) = (Vec::new(), Vec::new(), Vec::new());
    watch(&mut a1, &mut seen_a1, "a1", "/core/v1/endpoints/null/null").await;
    watch(&mut a2, &mut seen_a2, "a2", "/core/v1/endpoints/null/null").await;
    watch(&mut b2, &mut seen_b2, "b2", "/core/v1/endpoints/null/null").await;
    web_push(&mut a1, &mut seen_a1, &["10.1.0.1"]).await;
    web_push(&mut a2, &mut seen_a2, &["10.1.0.1"]).await;
    web_push(&mut b2, &mut seen_b2, &["10.2.0.1"]).await;

    // a2 moves to group b: its view becomes group b's.
    cluster.apply(node("a2", Some("b"))).unwrap();
    web_push(&mut a2, &mut seen_a2, &["10.2.0.1"]).await;
    // A new watch of a2 after the move (its first of EndpointSlices) starts from group b's
    // backends, and follows group b's changes.
    seen_a2.clear();
    watch(
        &mut a2,
        &mut seen_a2,
        "a2",
        "/discovery.k8s.io/v1/endpointslices/null/null",
    )
    .await;
    let first = push_with(
        &mut a2,
        &mut seen_a2,
        "default/endpointslice/web-abc",
        &["b1"],
    )
    .await;
    assert_eq!(first.operation(), Some(&Operation::Insert));
    cluster.apply(slice("web", &["a1", "b1", "b2"])).unwrap();
    push_with(
        &mut a2,
        &mut seen_a2,
        "default/endpointslice/web-abc",
        &["b1", "b2"],
    )
    .await;
    seen_a2.clear();

    // A change of group a's backends only, then one of group b's: a2 (now in b) is sent the
    // second, never the first; b2 likewise.
    cluster
        .apply(web_at(&[
            ("10.1.0.1", "a1"),
            ("10.1.0.2", "a1"),
            ("10.2.0.1", "b1"),
        ]))
        .unwrap();
    cluster
        .apply(web_at(&[
            ("10.1.0.1", "a1"),
            ("10.1.0.2", "a1"),
            ("10.2.0.1", "b1"),
            ("10.2.0.2", "b2"),
        ]))
        .unwrap();
    web_push(&mut a1, &mut seen_a1, &["10.1.0.1", "10.1.0.2"]).await;
    for (socket, seen) in [(&mut a2, &mut seen_a2), (&mut b2, &mut seen_b2)] {
        let update = web_push(socket, seen, &["10.2.0.1", "10.2.0.2"]).await;
        assert_eq!(update.operation(), Some(&Operation::Update));
        let others: Vec<&Message> = seen
            .iter()
            .filter(|m| m.resource() == "default/endpoints/web")
            .collect();
        assert!(
            others.iter().all(|m| ips(&m.content) == ["10.2.0.1"]),
            "a node of group b was sent group a's backends or a second copy: {others:?}"
        );
    }
    // Back in group a: a1's backends again, and group b's next change is not a2's.
    cluster.apply(node("a2", Some("a"))).unwrap();
    web_push(&mut a2, &mut seen_a2, &["10.1.0.1", "10.1.0.2"]).await;
    cluster
        .apply(web_at(&[
            ("10.1.0.1", "a1"),
            ("10.1.0.2", "a1"),
            ("10.2.0.1", "b1"),
        ]))
        .unwrap();
    web_push(&mut b2, &mut seen_b2, &["10.2.0.1"]).await;
    cluster
        .apply(web_at(&[("10.1.0.1", "a1"), ("10.2.0.1", "b1")]))
        .unwrap();
    web_push(&mut a2, &mut seen_a2, &["10.1.0.1"]).await;
    web_push(&mut a1, &mut seen_a1, &["10.1.0.1"]).await;
    assert!(
        !seen_a2
            .iter()
            .any(|m| m.resource() == "default/endpoints/web"
                && ips(&m.content).iter().any(|ip| ip.starts_with("10.2."))),
        "a2, back in group a, was sent group b's backends: {seen_a2:?}"
    );
}

/// NodeGroup `name` selecting `nodes` by name.
fn node_group(name: &str, nodes: &[&str]) -> Value {
    json!({"apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "NodeGroup",
           "metadata": {"name": name}, "spec": {"nodes": nodes}})
}

/// Waits until every `(node, group)` carries the group's label (the NodeGroup controller's).
async fn labelled(cluster: &EmbeddedCluster, want: &[(&str, &str)]) {
    eventually(&format!("nodes labelled {want:?}"), WITHIN, || {
        let done = want.iter().all(|(node, group)| {
            cluster
                .get("Node", None, node)
                .is_some_and(|n| n["metadata"]["labels"][BELONGING_TO] == *group)
        });
        async move { done.then_some(()) }
    })
    .await;
}

#[actix_rt::test]
async fn an_edgeapplications_one_service_shows_each_groups_edges_only_their_groups_backends_also_after_a_node_changes_group_or_a_pod_moves(
) {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start(dir.path(), |config| {
        config.modules.node_group_controller.enable = true;
    })
    .await;
    let cluster = cloud.cluster().unwrap().clone();
    for name in ["a1", "a2", "b1", "b2"] {
        cluster.apply(node(name, None)).unwrap();
    }
    cluster.apply(node_group("a", &["a1", "a2"])).unwrap();
    cluster.apply(node_group("b", &["b1", "b2"])).unwrap();
    labelled(
        &cluster,
        &[("a1", "a"), ("a2", "a"), ("b1", "b"), ("b2", "b")],
    )
    .await;
    cluster
        .apply(json!({
            "apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "EdgeApplication",
            "metadata": {"name": "shop", "namespace": "default"},
            "spec": {
                "workloadTemplate": {"manifests": [
                    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                     "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                              "template": {"metadata": {"labels": {"app": "web"}},
                                           "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}},
                    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                     "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}},
                ]},
                "workloadScope": {"targetNodeGroups": [{"name": "a"}, {"name": "b"}]},
            },
        }))
        .unwrap();
    // One Service, under the manifest's name, ranged; a Deployment per group.
    let service = eventually("Service web", WITHIN, || {
        let found = cluster.get("Service", Some("default"), "web");
        async move { found }
    })
    .await;
    assert_eq!(
        service["metadata"]["annotations"]["apps.kubeedge.io/service-topology"],
        "range-nodegroup"
    );
    eventually("a Deployment per group", WITHIN, || {
        let both = ["web-a", "web-b"]
            .iter()
            .all(|name| cluster.get("Deployment", Some("default"), name).is_some());
        async move { both.then_some(()) }
    })
    .await;
    assert_eq!(cluster.count("Service", |_| true), 1);
    // The endpoints of that one Service list both groups' pods (as Kubernetes' endpoints
    // controller writes them: its selector finds every group's Deployment's pods).
    cluster
        .apply(endpoints(
            "web",
            &[("a1", false), ("a2", false), ("b1", false), ("b2", false)],
        ))
        .unwrap();
    cluster
        .apply(slice("web", &["a1", "a2", "b1", "b2"]))
        .unwrap();

    let mut a1 = connect(&cloud, dir.path(), "a1").await;
    let mut b1 = connect(&cloud, dir.path(), "b1").await;
    // Each group's edges list and get `web` with their group's backends only.
    let listed = list(&mut a1, "a1", "endpoints").await;
    assert_eq!(ips(item(&listed, "web")), ips_of(&["a1", "a2"]));
    let listed = list(&mut b1, "b1", "endpoints").await;
    assert_eq!(ips(item(&listed, "web")), ips_of(&["b1", "b2"]));
    let slices = list(&mut a1, "a1", "endpointslices").await;
    assert_eq!(ips(item(&slices, "web-abc")), ips_of(&["a1", "a2"]));
    let slices = list(&mut b1, "b1", "endpointslices").await;
    assert_eq!(ips(item(&slices, "web-abc")), ips_of(&["b1", "b2"]));
    let got = body(
        &ask(
            &mut a1,
            &application("a1", Verb::Get, "/core/v1/endpoints/default/web", json!({})),
        )
        .await,
    );
    assert_eq!(ips(&got), ips_of(&["a1", "a2"]));

    let (mut seen_a, mut seen_b) = (Vec::new(), Vec::new());
    for (socket, seen, node) in [(&mut a1, &mut seen_a, "a1"), (&mut b1, &mut seen_b, "b1")] {
        watch(socket, seen, node, "/core/v1/endpoints/null/null").await;
    }
    push_with(&mut a1, &mut seen_a, "default/endpoints/web", &["a1", "a2"]).await;
    push_with(&mut b1, &mut seen_b, "default/endpoints/web", &["b1", "b2"]).await;

    // a2 changes group through the NodeGroups (the controller relabels it): both groups'
    // edges are sent their corrected view of the one Service.
    cluster.apply(node_group("a", &["a1"])).unwrap();
    cluster.apply(node_group("b", &["b1", "b2", "a2"])).unwrap();
    labelled(&cluster, &[("a2", "b")]).await;
    let fixed = push_with(&mut a1, &mut seen_a, "default/endpoints/web", &["a1"]).await;
    assert_eq!(fixed.operation(), Some(&Operation::Update));
    push_with(
        &mut b1,
        &mut seen_b,
        "default/endpoints/web",
        &["a2", "b1", "b2"],
    )
    .await;

    // A pod moves: b2's backend is rescheduled onto a1 (a new address there).
    let mut moved = endpoints("web", &[("a1", false), ("a2", false), ("b1", false)]);
    moved["subsets"][0]["addresses"]
        .as_array_mut()
        .unwrap()
        .push(json!({"ip": "10.0.0.99", "nodeName": "a1"}));
    cluster.apply(moved).unwrap();
    let update = until_push(&mut a1, &mut seen_a, |m| {
        m.resource() == "default/endpoints/web" && ips(&m.content).contains(&"10.0.0.99".into())
    })
    .await;
    assert_eq!(ips(&update.content), vec!["10.0.0.0", "10.0.0.99"]);
    push_with(&mut b1, &mut seen_b, "default/endpoints/web", &["a2", "b1"]).await;

    // Nothing either edge was sent of `web` named a backend of the other group at the time:
    // a1 never saw a group b node's address; b1 never saw a1's.
    for (seen, foreign, node) in [
        (&seen_a, vec![ip("b1"), ip("b2")], "a1"),
        (&seen_b, vec![ip("a1"), "10.0.0.99".to_owned()], "b1"),
    ] {
        for pushed in seen
            .iter()
            .filter(|m| m.resource() == "default/endpoints/web")
        {
            let got = ips(&pushed.content);
            assert!(
                foreign.iter().all(|ip| !got.contains(ip)),
                "{node} was sent another group's backend: {got:?}"
            );
        }
    }
}
