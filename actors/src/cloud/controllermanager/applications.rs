//! The EdgeApplication loop: makes, updates and deletes each application's workloads
//! (`workloads::render`) and writes its `status.workloadStatus`.

use std::collections::{BTreeMap, BTreeSet};

use edgehive_protocols::object::meta_str;
use serde_json::{json, Value};

use super::metrics::{Metrics, RETRY_INTERVAL};
use super::workloads::{render, Refused, Rendered, Workload, WORKLOAD_KINDS};
use crate::cloud::cluster::{EventType, SharedCluster, WatchEvent};
use crate::cloud::contract::route;
use crate::cloud::watcher::{Change, KindWatcher, WatchMetrics};

/// `(namespace, name)` of an application.
type AppKey = (String, String);
/// `(kind, namespace, name)` of a workload.
type WorkloadKey = (String, String, String);

/// Follows EdgeApplications and keeps their workloads as they ask.
pub(super) struct ApplicationWatcher {
    cluster: SharedCluster,
    metrics: Metrics,
    /// The applications as last seen.
    apps: BTreeMap<AppKey, Value>,
    /// The workloads made for each application since the process started.
    made: BTreeMap<AppKey, BTreeSet<WorkloadKey>>,
    /// Applications with a write that failed, tried again later.
    owed: BTreeSet<AppKey>,
    /// The refusals reported for each application (counted, logged and an Event written
    /// once each, not again on every status echo).
    reported: BTreeMap<AppKey, BTreeSet<String>>,
    /// Whether the workloads made before this process started are still to be swept
    /// ([`ApplicationWatcher::sweep`]): from the first complete list of applications until
    /// a sweep succeeds.
    sweep_owed: bool,
}

fn key_of(object: &Value) -> AppKey {
    (
        meta_str(object, "namespace").to_owned(),
        meta_str(object, "name").to_owned(),
    )
}

/// The name and uid of the EdgeApplication that controls `object` (its ownerReference with
/// `controller: true`), if one does.
fn controlling_application(object: &Value) -> Option<(&str, &str)> {
    object["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|owner| {
            owner["kind"] == "EdgeApplication"
                && owner["apiVersion"]
                    .as_str()
                    .is_some_and(|v| v.starts_with("apps.kubeedge.io/"))
                && owner["controller"] == true
        })
        .and_then(|owner| Some((owner["name"].as_str()?, owner["uid"].as_str()?)))
}

/// The annotation on each workload the controller writes: a hash of the object as the
/// application asked for it, so a field the application no longer gives (a label, an env
/// entry dropped) is a difference even though the cluster's copy still has it.
pub(super) const APPLIED: &str = "edgehive.io/applied-manifest";

/// `object` with its [`APPLIED`] annotation: the first 16 bytes of SHA-256 over its JSON.
fn stamped(object: &Value) -> Value {
    let text = object.to_string();
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let hash: String = digest.as_ref()[..16]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let mut object = object.clone();
    let annotations = &mut object["metadata"]["annotations"];
    if !annotations.is_object() {
        *annotations = json!({});
    }
    annotations[APPLIED] = json!(hash);
    object
}

/// Whether every field `desired` gives has that value in `current`: objects compared field
/// by field, lists item by item (of the same length), anything else whole. What the API
/// server adds (defaults such as a container's `imagePullPolicy`, a Service port's
/// `protocol`, a `clusterIP`, status) is no difference; a field removed from `desired` is
/// seen through the [`APPLIED`] hash.
fn contains(current: &Value, desired: &Value) -> bool {
    match (current, desired) {
        (_, Value::Object(fields)) => fields
            .iter()
            .all(|(key, value)| contains(&current[key.as_str()], value)),
        (Value::Array(have), Value::Array(want)) => {
            have.len() == want.len() && have.iter().zip(want).all(|(h, w)| contains(h, w))
        }
        _ => current == desired,
    }
}

impl ApplicationWatcher {
    pub(super) fn new(cluster: SharedCluster, metrics: Metrics) -> Self {
        ApplicationWatcher {
            cluster,
            metrics,
            apps: BTreeMap::new(),
            made: BTreeMap::new(),
            owed: BTreeSet::new(),
            reported: BTreeMap::new(),
            sweep_owed: false,
        }
    }

    pub(super) async fn run(mut self, metrics: WatchMetrics) {
        let follow = |kind: &str| {
            KindWatcher::new(self.cluster.clone(), route::NODEGROUPCONTROLLER, kind)
                .keeping(crate::cloud::watcher::keep_all)
                .counted(metrics.clone())
        };
        // The whole object is kept so that a delete a relist finds still says what to remove.
        let mut apps = follow("EdgeApplication");
        let mut retry = tokio::time::interval(RETRY_INTERVAL);
        let mut synced = false;
        loop {
            let owed = !self.owed.is_empty() || self.sweep_owed;
            tokio::select! {
                change = apps.next() => match change {
                    Change::Synced if !synced => {
                        synced = true;
                        self.sweep_owed = true;
                        self.sweep().await;
                    }
                    change => if let Some(event) = change.into_event() {
                        self.on_app(event).await;
                    },
                },
                _ = retry.tick(), if owed => {
                    for key in std::mem::take(&mut self.owed) {
                        if let Some(app) = self.apps.get(&key).cloned() {
                            self.apply(&app).await;
                        }
                    }
                    if self.sweep_owed {
                        self.sweep().await;
                    }
                }
            }
        }
    }

    /// Once every application was listed and applied: deletes the workloads an earlier run
    /// made that no application asks for now (this process's memory of what it made starts
    /// empty). A workload whose controlling EdgeApplication is listed but no longer asks for
    /// it (a group dropped, a manifest removed while the cloud was down) is deleted; so is
    /// one whose EdgeApplication no longer exists (deleted while the cloud was down), once
    /// a read of it says so, as Kubernetes' garbage collector would (the embedded cluster
    /// and the stand-in have none). A list or delete that fails is tried again later.
    async fn sweep(&mut self) {
        let by_uid: BTreeMap<String, AppKey> = self
            .apps
            .iter()
            .map(|(key, app)| (meta_str(app, "uid").to_owned(), key.clone()))
            .collect();
        let mut done = true;
        for (kind, _, _) in WORKLOAD_KINDS {
            let objects = match self.cluster.list(kind).await {
                Ok((objects, _)) => objects,
                Err(error) => {
                    tracing::warn!(%kind, %error, "cannot list workloads to find those no EdgeApplication asks for");
                    done = false;
                    continue;
                }
            };
            for object in objects {
                let Some((owner, uid)) = controlling_application(&object) else {
                    continue;
                };
                let namespace = meta_str(&object, "namespace").to_owned();
                let workload = (
                    (*kind).to_owned(),
                    namespace.clone(),
                    meta_str(&object, "name").to_owned(),
                );
                let stale = match by_uid.get(uid) {
                    Some(app) => !self.made.get(app).is_some_and(|m| m.contains(&workload)),
                    // Not listed: gone, unless a read finds it (made since the list).
                    None => match self
                        .cluster
                        .get("EdgeApplication", Some(&namespace), owner)
                        .await
                    {
                        Ok(app) => meta_str(&app, "uid") != uid,
                        Err(error) if error.status() == 404 => true,
                        Err(error) => {
                            tracing::warn!(%namespace, %owner, %error, "cannot read a workload's EdgeApplication");
                            done = false;
                            false
                        }
                    },
                };
                if stale && !self.delete(&workload).await {
                    done = false;
                }
            }
        }
        self.sweep_owed = !done;
    }

    async fn on_app(&mut self, event: WatchEvent) {
        let key = key_of(&event.object);
        if event.event_type != EventType::Deleted {
            self.apps.insert(key, event.object.clone());
            self.apply(&event.object).await;
            return;
        }
        // On a Kubernetes API server the garbage collector removes what it owned too; the
        // embedded cluster has none.
        self.apps.remove(&key);
        self.owed.remove(&key);
        self.reported.remove(&key);
        let mut gone = self.made.remove(&key).unwrap_or_default();
        gone.extend(render(&event.object).workloads.iter().map(Workload::key));
        for workload in gone {
            self.delete(&workload).await;
        }
    }

    async fn delete(&self, (kind, namespace, name): &WorkloadKey) -> bool {
        match self.cluster.delete(kind, Some(namespace), name, None).await {
            Ok(_) => {
                self.metrics.count("delete", true);
                true
            }
            Err(error) if error.status() == 404 => true,
            Err(error) => {
                tracing::warn!(%kind, %namespace, %name, %error, "cannot delete an EdgeApplication's workload");
                self.metrics.count("delete", false);
                false
            }
        }
    }

    /// Makes or updates `app`'s workloads, deletes those it no longer asks for, writes its
    /// status.
    async fn apply(&mut self, app: &Value) {
        let key = key_of(app);
        let Rendered { workloads, refused } = render(app);
        self.report(app, &key, &refused).await;
        let mut failed = false;
        let mut statuses = Vec::new();
        let mut desired = BTreeSet::new();
        for workload in &workloads {
            let ok = self.write(&workload.object).await;
            failed |= !ok;
            let (kind, namespace, name) = workload.key();
            let api_version = workload.object["apiVersion"].as_str().unwrap_or_default();
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
            statuses.push(json!({
                "identifier": {
                    "group": group, "version": version, "kind": kind,
                    "resource": format!("{}s", kind.to_ascii_lowercase()),
                    "namespace": namespace, "name": name, "ordinal": workload.ordinal,
                },
                "conditions": if ok { "Available" } else { "Processing" },
            }));
            desired.insert(workload.key());
        }
        // A refused manifest has its entry too, `Processing` (the CRD's conditions are
        // `Processing` and `Available`; the why is in the Event and the log).
        for refused in &refused {
            let (group, version) = refused
                .api_version
                .rsplit_once('/')
                .unwrap_or(("", &refused.api_version));
            statuses.push(json!({
                "identifier": {
                    "group": group, "version": version, "kind": refused.kind,
                    "namespace": refused.namespace, "name": refused.name,
                    "ordinal": refused.ordinal,
                },
                "conditions": "Processing",
            }));
        }
        // KubeEdge's order: by manifest, then name.
        statuses.sort_by(|a, b| {
            let at = |s: &Value| {
                (
                    s["identifier"]["ordinal"].as_u64().unwrap_or_default(),
                    s["identifier"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                )
            };
            at(a).cmp(&at(b))
        });
        let before = self.made.insert(key.clone(), desired.clone());
        for stale in before.unwrap_or_default().difference(&desired) {
            if !self.delete(stale).await {
                failed = true;
                self.made
                    .entry(key.clone())
                    .or_default()
                    .insert(stale.clone());
            }
        }
        let statuses = Value::Array(statuses);
        if app["status"]["workloadStatus"] != statuses {
            let patch = json!({"status": {"workloadStatus": statuses}});
            let (namespace, name) = &key;
            let written = self
                .cluster
                .patch("EdgeApplication", Some(namespace), name, patch, true)
                .await;
            match written {
                Ok(_) => self.metrics.count("status", true),
                Err(error) if error.status() == 404 => {}
                Err(error) => {
                    tracing::warn!(%namespace, %name, %error, "cannot write the EdgeApplication's status");
                    self.metrics.count("status", false);
                    failed = true;
                }
            }
        }
        if failed {
            self.owed.insert(key);
        }
    }

    /// Counts, logs and writes an Event on `app` for each refusal not reported yet.
    async fn report(&mut self, app: &Value, key: &AppKey, refused: &[Refused]) {
        let now: BTreeSet<String> = refused.iter().map(|r| r.message.clone()).collect();
        let before = self.reported.insert(key.clone(), now).unwrap_or_default();
        for refused in refused {
            if before.contains(&refused.message) {
                continue;
            }
            self.metrics.refused(refused.reason);
            let (namespace, name) = key;
            tracing::warn!(%namespace, %name, reason = refused.reason, "EdgeApplication manifest refused: {}", refused.message);
            let event = refusal_event(app, refused);
            match self.cluster.create(event).await {
                Ok(_) => self.metrics.count("event", true),
                Err(error) if error.status() == 409 => {}
                Err(error) => {
                    tracing::warn!(%namespace, %name, %error, "cannot write the EdgeApplication's Event");
                    self.metrics.count("event", false);
                }
            }
        }
    }

    /// Creates `object`, or updates it when the cluster's copy differs; whether it is as
    /// asked now.
    async fn write(&self, object: &Value) -> bool {
        let kind = object["kind"].as_str().unwrap_or_default();
        let namespace = meta_str(object, "namespace");
        let name = meta_str(object, "name");
        let object = &stamped(object);
        let written = match self.cluster.get(kind, Some(namespace), name).await {
            Err(error) if error.status() == 404 => self.cluster.create(object.clone()).await,
            Ok(current) if contains(&current, object) => return true,
            Ok(current) => {
                let mut object = object.clone();
                object["metadata"]["resourceVersion"] =
                    json!(meta_str(&current, "resourceVersion"));
                self.cluster.update(object).await
            }
            Err(error) => Err(error),
        };
        match written {
            Ok(_) => {
                self.metrics.count("workload", true);
                true
            }
            Err(error) => {
                tracing::warn!(%kind, %namespace, %name, %error, "cannot write an EdgeApplication's workload");
                self.metrics.count("workload", false);
                false
            }
        }
    }
}

/// A Warning Event on `app` saying why a manifest is not made (`kubectl describe` shows
/// it), named after the application and the refusal, so the same refusal is one Event.
fn refusal_event(app: &Value, refused: &Refused) -> Value {
    use std::hash::{Hash, Hasher};
    let (namespace, name) = key_of(app);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (meta_str(app, "uid"), &refused.message).hash(&mut hasher);
    let now = edgehive_protocols::object::now_rfc3339();
    json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{name}.{:016x}", hasher.finish()), "namespace": namespace},
        "involvedObject": {
            "apiVersion": app["apiVersion"], "kind": "EdgeApplication",
            "namespace": namespace, "name": name, "uid": meta_str(app, "uid"),
        },
        "reason": "ManifestRefused",
        "message": refused.message,
        "type": "Warning",
        "source": {"component": "edgehive-nodegroupcontroller"},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Deployment as an application asks for it.
    fn asked() -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web-east", "namespace": "default", "labels": {"app": "web"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"nodeSelector": {"apps.kubeedge.io/belonging-to": "east"},
                        "containers": [{"name": "web", "image": "nginx:1.27",
                            "env": [{"name": "A", "value": "1"}],
                            "ports": [{"containerPort": 80}]}]}}}})
    }

    /// `object` as a Kubernetes API server returns it: its defaults filled in.
    fn as_the_api_server_returns(object: &Value) -> Value {
        let mut object = object.clone();
        object["metadata"]["resourceVersion"] = json!("7");
        object["metadata"]["generation"] = json!(1);
        object["spec"]["revisionHistoryLimit"] = json!(10);
        object["spec"]["progressDeadlineSeconds"] = json!(600);
        let pod = &mut object["spec"]["template"]["spec"];
        pod["restartPolicy"] = json!("Always");
        pod["dnsPolicy"] = json!("ClusterFirst");
        let container = &mut pod["containers"][0];
        container["imagePullPolicy"] = json!("IfNotPresent");
        container["terminationMessagePath"] = json!("/dev/termination-log");
        container["ports"][0]["protocol"] = json!("TCP");
        object["status"] = json!({"replicas": 1});
        object
    }

    #[test]
    fn a_workload_the_api_server_filled_with_defaults_is_as_asked_and_a_field_dropped_is_not() {
        let written = stamped(&asked());
        let current = as_the_api_server_returns(&written);
        assert!(
            contains(&current, &written),
            "defaults in a container and a port are no difference"
        );
        // An env entry dropped from the manifest: the cluster's copy still has it, but the
        // applied hash differs.
        let mut fewer = asked();
        fewer["spec"]["template"]["spec"]["containers"][0]
            .as_object_mut()
            .unwrap()
            .remove("env");
        assert!(!contains(&current, &stamped(&fewer)));
        // A label dropped likewise.
        let mut unlabelled = asked();
        unlabelled["metadata"]["labels"] = json!({});
        assert!(!contains(&current, &stamped(&unlabelled)));
        // A value changed by hand in the cluster is a difference.
        let mut edited = current.clone();
        edited["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:1");
        assert!(!contains(&edited, &written));
        // A container added by hand is a difference (the lists differ in length).
        let mut added = current.clone();
        added["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "x", "image": "x"}));
        assert!(!contains(&added, &written));
    }
}
