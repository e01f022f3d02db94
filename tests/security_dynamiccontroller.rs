//! What a node cannot read through the cloud's DynamicController (an edge MetaServer's
//! list, get and watch), replayed as attacks over mutual TLS against a running cloud: each
//! refused read is sent again, in other forms (another namespace, a selector, a list, a
//! watch) and from other nodes, and stays refused, counted in
//! `edgehive_dynamiccontroller_refused_total{reason}`. KubeEdge's cloudcore answered these
//! with other nodes' pods and every Secret (shared/golden/README.md).

use crate::dynamiccontroller::{
    again, answer_to, application, ask, connect, metrics, names, rejection, start,
    subscriptions_become, until_push,
};
use crate::support::*;
use crate::tls_join::send;

use edgehive_protocols::application::{ApplicationStatus, Verb};
use edgehive_protocols::{Message, Operation};
use serde_json::json;

fn refused(metrics: &str, reason: &str) -> u64 {
    metric_sum(
        metrics,
        &format!("edgehive_dynamiccontroller_refused_total{{reason=\"{reason}\"}}"),
    )
}

/// A 403 Status naming `node`.
fn forbidden(app: &edgehive_protocols::application::Application, node: &str) {
    let status = rejection(app);
    assert_eq!(status["code"], 403, "{status}");
    assert_eq!(status["reason"], "Forbidden");
    assert!(
        status["message"].as_str().unwrap().contains(node),
        "{status}"
    );
}

#[actix_rt::test]
async fn a_node_reads_only_its_own_objects_however_and_from_wherever_it_asks() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start(dir.path(), |_| {}).await;
    let cluster = cloud.cluster().unwrap().clone();
    for node in ["edge-a", "edge-b", "edge-c"] {
        cluster.apply(edge_node(node)).unwrap();
        // Each node's pod uses a Secret and a ConfigMap of its own.
        let mut own = pod(&format!("{node}-pod"), node);
        own["spec"]["containers"][0]["envFrom"] = json!([
            {"secretRef": {"name": format!("{node}-secret")}},
            {"configMapRef": {"name": format!("{node}-cm")}},
        ]);
        cluster.apply(own).unwrap();
        cluster
            .apply(json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": format!("{node}-secret"), "namespace": "default"},
                "data": {"password": "c2VjcmV0"}}))
            .unwrap();
        cluster
            .apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("{node}-cm"), "namespace": "default"}}))
            .unwrap();
    }
    cluster
        .apply(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "admin-token", "namespace": "kube-system"},
            "data": {"token": "c2VjcmV0"}}))
        .unwrap();

    // The victim reads its own: the refusals below are about who asks.
    let mut victim = connect(&cloud, dir.path(), "edge-b").await;
    let own = ask(
        &mut victim,
        &application(
            "edge-b",
            Verb::Get,
            "/core/v1/secrets/default/edge-b-secret",
            json!({}),
        ),
    )
    .await;
    assert_eq!(own.status, ApplicationStatus::Approved);

    let mut not_bound = 0;
    let mut not_allowed = 0;
    let mut writes = 0;
    for attacker in ["edge-a", "edge-c"] {
        for _ in 0..3 {
            // A fresh connection each round.
            let mut socket = connect(&cloud, dir.path(), attacker).await;
            let get = |key: &str| application(attacker, Verb::Get, key, json!({}));
            let list = |key: &str, option| application(attacker, Verb::List, key, option);
            // Another node's pod, Secret, ConfigMap, Node, by get: 403.
            for key in [
                "/core/v1/pods/default/edge-b-pod",
                "/core/v1/secrets/default/edge-b-secret",
                "/core/v1/configmaps/default/edge-b-cm",
                "/core/v1/nodes/null/edge-b",
                // The same under another namespace and with a namespace on a cluster kind.
                "/core/v1/secrets/kube-system/admin-token",
                "/core/v1/secrets/null/edge-b-secret",
                "/core/v1/nodes/default/edge-b",
                "/core/v1/serviceaccounts/default/default",
            ] {
                forbidden(&ask(&mut socket, &get(key)).await, attacker);
                not_bound += 1;
            }
            // By list, in every form: only its own.
            let own_pod = format!("{attacker}-pod");
            for (key, option) in [
                ("/core/v1/pods/null/null", json!({})),
                ("/core/v1/pods/default/null", json!({"limit": 500})),
                (
                    "/core/v1/pods/null/null",
                    json!({"fieldSelector": "spec.nodeName=edge-b"}),
                ),
                (
                    "/core/v1/pods/default/null",
                    json!({"labelSelector": "app=edge-b-pod"}),
                ),
            ] {
                let listed = names(&ask(&mut socket, &list(key, option.clone())).await);
                assert!(
                    listed.iter().all(|name| *name == own_pod),
                    "{attacker} listed {listed:?} with {option}"
                );
            }
            for (key, own) in [
                ("/core/v1/secrets/null/null", format!("{attacker}-secret")),
                ("/core/v1/configmaps/default/null", format!("{attacker}-cm")),
                ("/core/v1/nodes/null/null", attacker.to_owned()),
            ] {
                assert_eq!(names(&ask(&mut socket, &list(key, json!({}))).await), [own]);
            }
            // Kinds nobody allowed: 403 by get, list and watch.
            for (verb, key) in [
                (
                    Verb::Get,
                    "/rbac.authorization.k8s.io/v1/clusterroles/null/admin",
                ),
                (
                    Verb::List,
                    "/rbac.authorization.k8s.io/v1/clusterroles/null/null",
                ),
                (Verb::Watch, "/apps/v1/deployments/default/null"),
                (Verb::List, "/core/v1/leases/null/null"),
            ] {
                let app = application(attacker, verb, key, json!({}));
                forbidden(&ask(&mut socket, &app).await, attacker);
                not_allowed += 1;
            }
            // Writes: 405, whatever the resource.
            for verb in [Verb::Create, Verb::Update, Verb::Patch, Verb::Delete] {
                let app = application(
                    attacker,
                    verb,
                    "/core/v1/pods/default/edge-b-pod",
                    json!({}),
                );
                let status = rejection(&ask(&mut socket, &app).await).clone();
                assert_eq!(status["code"], 405, "{status}");
                assert_eq!(status["reason"], "MethodNotAllowed");
                writes += 1;
            }
            // Asking in the victim's name: the connection's node decides, and it is refused.
            let spoofed = application(
                "edge-b",
                Verb::Get,
                "/core/v1/secrets/default/edge-b-secret",
                json!({}),
            );
            forbidden(&ask(&mut socket, &spoofed).await, attacker);
        }
    }

    // A watch of every pod and Secret: the victim's changes never reach the attacker.
    let mut socket = connect(&cloud, dir.path(), "edge-a").await;
    for key in ["/core/v1/pods/null/null", "/core/v1/secrets/null/null"] {
        let watch = application("edge-a", Verb::Watch, key, json!({"watch": true}));
        assert_eq!(
            ask(&mut socket, &watch).await.status,
            ApplicationStatus::Approved
        );
    }
    let mut victim_pod = pod("edge-b-pod", "edge-b");
    victim_pod["metadata"]["labels"]["changed"] = json!("yes");
    cluster.apply(victim_pod).unwrap();
    cluster
        .apply(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "edge-b-secret", "namespace": "default"},
            "data": {"password": "Y2hhbmdlZA=="}}))
        .unwrap();
    let mut own_pod = pod("edge-a-pod", "edge-a");
    own_pod["metadata"]["labels"]["changed"] = json!("yes");
    cluster.apply(own_pod).unwrap();
    // Pods are pushed in the order they changed: its own change comes after the victim's.
    let mut seen = Vec::new();
    until_push(&mut socket, &mut seen, |m| {
        m.resource() == "default/pod/edge-a-pod"
            && m.content["metadata"]["labels"]["changed"] == "yes"
    })
    .await;
    assert!(
        !seen.iter().any(|m| m.resource().contains("edge-b")),
        "edge-a was pushed edge-b's objects: {seen:?}"
    );

    let text = metrics(&cloud).await;
    assert_eq!(refused(&text, "not_bound"), not_bound, "{text}");
    assert_eq!(refused(&text, "not_allowed"), not_allowed);
    assert_eq!(refused(&text, "write"), writes);
    assert_eq!(refused(&text, "other_node"), 6);
}

#[actix_rt::test]
async fn a_nodes_watches_are_bounded_and_malformed_applications_are_refused_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start(dir.path(), |config| {
        config.modules.dynamic_controller.max_watches_per_node = 2;
    })
    .await;
    let cluster = cloud.cluster().unwrap().clone();
    for node in ["edge-a", "edge-b"] {
        cluster.apply(edge_node(node)).unwrap();
    }
    let mut a = connect(&cloud, dir.path(), "edge-a").await;
    let watch = |node: &str, key: &str| application(node, Verb::Watch, key, json!({"watch": true}));
    for key in ["/core/v1/pods/null/null", "/core/v1/services/null/null"] {
        assert_eq!(
            ask(&mut a, &watch("edge-a", key)).await.status,
            ApplicationStatus::Approved
        );
    }
    // A third, again and again, on other kinds: 429.
    for _ in 0..3 {
        for key in [
            "/core/v1/endpoints/null/null",
            "/core/v1/namespaces/null/null",
        ] {
            let status = rejection(&ask(&mut a, &watch("edge-a", key)).await).clone();
            assert_eq!(status["code"], 429, "{status}");
        }
    }
    // Another node is not held back by it.
    let mut b = connect(&cloud, dir.path(), "edge-b").await;
    for key in ["/core/v1/pods/null/null", "/core/v1/services/null/null"] {
        assert_eq!(
            ask(&mut b, &watch("edge-b", key)).await.status,
            ApplicationStatus::Approved
        );
    }
    subscriptions_become(&cloud, 4).await;
    // `watchapp/sync` {} ends edge-a's watches: it may watch again.
    let sync = again(124);
    send(&mut a, &sync).await;
    answer_to(&mut a, &sync, &mut Vec::new()).await;
    subscriptions_become(&cloud, 2).await;
    let again = watch("edge-a", "/core/v1/endpoints/null/null");
    assert_eq!(
        ask(&mut a, &again).await.status,
        ApplicationStatus::Approved
    );

    // Content that is no Application (an unknown verb, not JSON), sent three times: an
    // `error` reply each time, counted, and the node keeps being served.
    for _ in 0..3 {
        for content in [
            json!({"ID": "x", "Key": "/core/v1/pods/null/null", "Verb": "deletecollection", "Status": "InApplying"}),
            json!("not an application"),
        ] {
            let mut bad: Message =
                application("edge-a", Verb::List, "/core/v1/pods/null/null", json!({}));
            bad.content = content;
            send(&mut a, &bad).await;
            let reply = answer_to(&mut a, &bad, &mut Vec::new()).await;
            assert_eq!(reply.operation(), Some(&Operation::Error), "{reply:?}");
        }
    }
    let list = application("edge-a", Verb::List, "/core/v1/nodes/null/null", json!({}));
    assert_eq!(names(&ask(&mut a, &list).await), ["edge-a"]);

    let text = metrics(&cloud).await;
    assert_eq!(refused(&text, "watch_limit"), 6, "{text}");
    assert_eq!(refused(&text, "malformed"), 6);
}
