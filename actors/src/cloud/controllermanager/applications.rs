//! The EdgeApplication loop: makes, updates and deletes each application's workloads
//! (`workloads::render`) and writes its `status.workloadStatus`.

use std::collections::{BTreeMap, BTreeSet};

use edgehive_protocols::object::meta_str;
use serde_json::{json, Value};

use super::metrics::{Metrics, MAX_RETRY_INTERVAL, RETRY_INTERVAL};
use super::workloads::{render, Refused, Rendered, Workload, SERVICE_TOPOLOGY, WORKLOAD_KINDS};
use crate::cloud::cluster::{EventType, SharedCluster, WatchEvent};
use crate::cloud::contract::route;
use crate::cloud::watcher::{Change, KindWatcher, WatchMetrics};

use tokio::time::{Duration, Instant};

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
    /// Applications with a write that failed (not refused), tried again when due.
    owed: BTreeMap<AppKey, Owed>,
    /// The workload writes the API server refused with a 4xx a retry cannot fix, by
    /// application: not tried again until the application's spec or the workload changes.
    refusals: BTreeMap<AppKey, BTreeMap<WorkloadKey, WriteRefusal>>,
    /// The refusals reported for each application (counted, logged and an Event written
    /// once each, not again on every status echo).
    reported: BTreeMap<AppKey, BTreeSet<String>>,
    /// What of the sweep of the workloads made before this process started
    /// ([`ApplicationWatcher::sweep`]) failed and is tried again, when due.
    sweep_left: Option<SweepLeft>,
}

/// What of the start sweep failed: the kinds whose list failed and the objects whose check
/// or delete failed, tried again (those alone) when due, with the writes' doubling backoff.
#[derive(Debug)]
struct SweepLeft {
    lists: Vec<&'static str>,
    objects: BTreeMap<WorkloadKey, Value>,
    owed: Owed,
}

/// An application whose writes failed: when they are tried again, and how long the wait
/// after that one is, doubled from [`RETRY_INTERVAL`] on each retry up to
/// [`MAX_RETRY_INTERVAL`] (reset once they all succeed).
#[derive(Debug, Clone, Copy)]
struct Owed {
    due: Instant,
    delay: Duration,
}

/// A workload write the API server refused for good (422 Invalid, e.g. an immutable field
/// changed; another 4xx a retry cannot fix), and what it was refused for.
#[derive(Debug, Clone, PartialEq)]
struct WriteRefusal {
    /// The counter's reason label: `invalid` (422) or `rejected`.
    reason: &'static str,
    /// Kubernetes' reason (`Invalid`, `BadRequest`, ...), shown in the status entry.
    api_reason: String,
    /// The API server's message.
    message: String,
    /// A hash of the application's spec when refused.
    app: u64,
    /// The workload's resourceVersion in the cluster when refused (`None`: there was none).
    current: Option<String>,
}

/// How a workload write went.
enum Written {
    /// The workload is as asked.
    Done,
    /// Failed in a way a retry may fix (conflict, throttled, the API server unavailable).
    Failed,
    /// Refused for good; not tried again until the application or the workload changes.
    Refused(WriteRefusal),
}

/// The write a workload needs.
enum Write {
    /// It is missing.
    Create,
    /// It differs: replaced at the current resourceVersion.
    Update(Value),
    /// An earlier build wrote it as asked: the merge patch that adds the [`APPLIED`]
    /// annotation.
    Annotate(Value),
}

/// The refusal reason label for an API server answer a retry cannot fix: 422 (`invalid`)
/// and the 4xx that say the request itself is wrong (`rejected`); `None` for those a retry
/// may fix: 401/403 (credentials, RBAC), 404 (a namespace not made yet), 408, 409 (a
/// conflict), 429 (throttled), 5xx.
fn refusal_reason(status: u16) -> Option<&'static str> {
    match status {
        422 => Some("invalid"),
        401 | 403 | 404 | 408 | 409 | 429 => None,
        400..=499 => Some("rejected"),
        _ => None,
    }
}

/// A hash of `app`'s spec: what it asks for, not its status.
fn spec_hash(app: &Value) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    app["spec"].to_string().hash(&mut hasher);
    hasher.finish()
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

/// Whether `object` carries the [`APPLIED`] annotation: edgehive wrote it.
fn has_applied(object: &Value) -> bool {
    object["metadata"]["annotations"][APPLIED].is_string()
}

/// Whether `object` is a per-group Service an edgehive before the applied-manifest
/// annotation made (`<manifest name>-<group>`, annotated `range-nodegroup`): a Service
/// without [`APPLIED`] but with [`SERVICE_TOPOLOGY`] `range-nodegroup`.
fn legacy_service(kind: &str, object: &Value) -> bool {
    kind == "Service"
        && !has_applied(object)
        && object["metadata"]["annotations"][SERVICE_TOPOLOGY] == "range-nodegroup"
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
/// `protocol`, a `clusterIP`, status) is no difference, nor what it normalizes: an empty
/// list it drops (`args: []`), a resource quantity it writes in its canonical form
/// (`cpu: 0.5` read back as `500m`). A field removed from `desired` is seen through the
/// [`APPLIED`] hash.
fn contains(current: &Value, desired: &Value) -> bool {
    contains_as(current, desired, Field::Plain)
}

/// What a field holds, for [`contains`]: quantities are compared by value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Plain,
    /// A map of resource quantities (`limits`, `requests`).
    Quantities,
    /// One resource quantity (an entry of those, `sizeLimit`).
    Quantity,
}

fn contains_as(current: &Value, desired: &Value, field: Field) -> bool {
    match (current, desired) {
        (_, Value::Object(fields)) => fields.iter().all(|(key, value)| {
            let inner = match (field, key.as_str()) {
                (Field::Quantities, _) | (_, "sizeLimit") => Field::Quantity,
                (_, "limits" | "requests") => Field::Quantities,
                _ => Field::Plain,
            };
            contains_as(&current[key.as_str()], value, inner)
        }),
        (Value::Null, Value::Array(want)) => want.is_empty(),
        (Value::Array(have), Value::Array(want)) => {
            have.len() == want.len()
                && have
                    .iter()
                    .zip(want)
                    .all(|(h, w)| contains_as(h, w, Field::Plain))
        }
        _ if field == Field::Quantity && current != desired => {
            matches!((quantity(current), quantity(desired)), (Some(a), Some(b)) if a == b)
        }
        _ => current == desired,
    }
}

/// A Kubernetes resource quantity (`0.5`, `"500m"`, `"1Gi"`, `"1e3"`) in nano-units, rounded
/// up as the API server rounds; `None` when it is not one.
fn quantity(value: &Value) -> Option<i128> {
    let text = match value {
        Value::String(text) => text.trim().to_owned(),
        Value::Number(number) => number.to_string(),
        _ => return None,
    };
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(&text)),
    };
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let (binary, decimal): (u32, i32) = match suffix {
        "" => (0, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        _ => (0, suffix.strip_prefix(['e', 'E'])?.parse().ok()?),
    };
    let digits: i128 = format!("{whole}{fraction}").parse().ok()?;
    let fraction_digits = i32::try_from(fraction.len()).ok()?;
    let exponent = decimal.checked_add(9)?.checked_sub(fraction_digits)?;
    let scaled = digits.checked_mul(1_i128.checked_shl(binary)?)?;
    let nanos = if exponent >= 0 {
        scaled.checked_mul(10_i128.checked_pow(exponent.unsigned_abs())?)?
    } else {
        let divisor = 10_i128.checked_pow(exponent.unsigned_abs())?;
        scaled.checked_add(divisor - 1)? / divisor
    };
    Some(if negative { -nanos } else { nanos })
}

impl ApplicationWatcher {
    pub(super) fn new(cluster: SharedCluster, metrics: Metrics) -> Self {
        ApplicationWatcher {
            cluster,
            metrics,
            apps: BTreeMap::new(),
            made: BTreeMap::new(),
            owed: BTreeMap::new(),
            refusals: BTreeMap::new(),
            reported: BTreeMap::new(),
            sweep_left: None,
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
        let mut synced = false;
        loop {
            let wake = self.next_retry();
            tokio::select! {
                change = apps.next() => match change {
                    Change::Synced if !synced => {
                        synced = true;
                        self.sweep(Instant::now()).await;
                    }
                    change => if let Some(event) = change.into_event() {
                        self.on_app(event).await;
                    },
                },
                _ = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {
                    self.retry_due(Instant::now()).await;
                }
            }
        }
    }

    /// When the next retry is due: the earliest owed application's, or the sweep's.
    fn next_retry(&self) -> Option<Instant> {
        self.owed
            .values()
            .map(|owed| owed.due)
            .chain(self.sweep_left.as_ref().map(|left| left.owed.due))
            .min()
    }

    /// Tries again the writes of the applications due by `now` (each one's next wait
    /// doubled, up to [`MAX_RETRY_INTERVAL`]), and the sweep if due.
    async fn retry_due(&mut self, now: Instant) {
        let due: Vec<AppKey> = self
            .owed
            .iter()
            .filter(|(_, owed)| owed.due <= now)
            .map(|(key, _)| key.clone())
            .collect();
        for key in due {
            let Some(app) = self.apps.get(&key).cloned() else {
                self.owed.remove(&key);
                continue;
            };
            if let Some(owed) = self.owed.get_mut(&key) {
                owed.delay = (owed.delay * 2).min(MAX_RETRY_INTERVAL);
                owed.due = now + owed.delay;
            }
            self.apply(&app).await;
        }
        if self
            .sweep_left
            .as_ref()
            .is_some_and(|left| left.owed.due <= now)
        {
            self.sweep(now).await;
        }
    }

    /// Once every application was listed and applied: deletes the workloads an earlier run
    /// made that no application asks for now (this process's memory of what it made starts
    /// empty). Only what edgehive wrote is swept: an object with the [`APPLIED`] annotation
    /// (and a per-group Service of an older edgehive, [`legacy_service`]) whose controlling
    /// EdgeApplication no longer asks for it (a group dropped, a manifest removed while the
    /// cloud was down) or no longer exists (deleted while the cloud was down), as a re-read
    /// of the application says: another replica may have made it for the application's
    /// newer spec. Each delete carries the uid listed, so an object made again since is
    /// never hit. A list, read or delete that fails is tried again, that one alone, with
    /// the writes' doubling backoff.
    async fn sweep(&mut self, now: Instant) {
        let (lists, mut candidates, delay) = match self.sweep_left.take() {
            None => (
                WORKLOAD_KINDS.iter().map(|(kind, _, _)| *kind).collect(),
                BTreeMap::new(),
                None,
            ),
            Some(left) => (left.lists, left.objects, Some(left.owed.delay)),
        };
        let mut failed_lists = Vec::new();
        for kind in lists {
            match self.cluster.list(kind).await {
                Ok((objects, _)) => {
                    for object in objects {
                        if controlling_application(&object).is_some()
                            && (has_applied(&object) || legacy_service(kind, &object))
                        {
                            let workload = (
                                kind.to_owned(),
                                meta_str(&object, "namespace").to_owned(),
                                meta_str(&object, "name").to_owned(),
                            );
                            candidates.insert(workload, object);
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(%kind, %error, "cannot list workloads to find those no EdgeApplication asks for");
                    failed_lists.push(kind);
                }
            }
        }
        let mut failed = BTreeMap::new();
        for (workload, object) in candidates {
            if !self.sweep_one(&workload, &object).await {
                failed.insert(workload, object);
            }
        }
        if failed_lists.is_empty() && failed.is_empty() {
            return;
        }
        let delay = delay.map_or(RETRY_INTERVAL, |delay| (delay * 2).min(MAX_RETRY_INTERVAL));
        self.sweep_left = Some(SweepLeft {
            lists: failed_lists,
            objects: failed,
            owed: Owed {
                due: now + delay,
                delay,
            },
        });
    }

    /// Deletes `object` (listed as `workload`) unless its application asks for it: this
    /// run made it, or the application as read now asks for it. `false` when the read or
    /// the delete failed.
    async fn sweep_one(&self, workload: &WorkloadKey, object: &Value) -> bool {
        let Some((owner, owner_uid)) = controlling_application(object) else {
            return true;
        };
        let namespace = &workload.1;
        let app_key = (namespace.clone(), owner.to_owned());
        let known = self
            .apps
            .get(&app_key)
            .is_some_and(|app| meta_str(app, "uid") == owner_uid);
        if known
            && self
                .made
                .get(&app_key)
                .is_some_and(|m| m.contains(workload))
        {
            return true;
        }
        match self
            .cluster
            .get("EdgeApplication", Some(namespace), owner)
            .await
        {
            Ok(app) if meta_str(&app, "uid") == owner_uid => {
                if render(&app).workloads.iter().any(|w| w.key() == *workload) {
                    return true;
                }
            }
            // Another application of that name: the owner is gone.
            Ok(_) => {}
            Err(error) if error.status() == 404 => {}
            Err(error) => {
                tracing::warn!(%namespace, %owner, %error, "cannot read a workload's EdgeApplication");
                return false;
            }
        }
        let uid = Some(meta_str(object, "uid")).filter(|uid| !uid.is_empty());
        self.delete(workload, uid).await
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
        self.refusals.remove(&key);
        self.reported.remove(&key);
        let mut gone = self.made.remove(&key).unwrap_or_default();
        gone.extend(render(&event.object).workloads.iter().map(Workload::key));
        for workload in gone {
            self.delete(&workload, None).await;
        }
    }

    /// Deletes a workload and, in the background, what it owns (a Job's pods: a Job's
    /// default is to orphan them); only the incarnation `uid` when given.
    async fn delete(&self, (kind, namespace, name): &WorkloadKey, uid: Option<&str>) -> bool {
        let deleted = self
            .cluster
            .delete_owner(kind, Some(namespace), name, uid)
            .await;
        match deleted {
            Ok(_) => {
                self.metrics.count("delete", true);
                true
            }
            Err(error) if error.status() == 404 => true,
            // The uid precondition failed: the object there now was made since; not ours to delete.
            Err(error) if uid.is_some() && error.status() == 409 => true,
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
        let app_hash = spec_hash(app);
        let before = self.refusals.remove(&key).unwrap_or_default();
        let mut refusals = BTreeMap::new();
        for workload in &workloads {
            let workload_key = workload.key();
            let known = before.get(&workload_key);
            let written = self.write(&workload.object, app_hash, known).await;
            let (kind, namespace, name) = workload.key();
            let api_version = workload.object["apiVersion"].as_str().unwrap_or_default();
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
            let mut status = json!({
                "identifier": {
                    "group": group, "version": version, "kind": kind,
                    "resource": format!("{}s", kind.to_ascii_lowercase()),
                    "namespace": namespace, "name": name, "ordinal": workload.ordinal,
                },
                "conditions": "Available",
            });
            match written {
                Written::Done => {}
                Written::Failed => {
                    failed = true;
                    status["conditions"] = json!("Processing");
                }
                Written::Refused(refusal) => {
                    status["conditions"] = json!("Processing");
                    status["reason"] = json!(refusal.api_reason);
                    status["message"] = json!(refusal.message);
                    if known != Some(&refusal) {
                        self.announce_write_refusal(app, workload, &refusal).await;
                    }
                    refusals.insert(workload_key.clone(), refusal);
                }
            }
            statuses.push(status);
            desired.insert(workload_key);
        }
        if !refusals.is_empty() {
            self.refusals.insert(key.clone(), refusals);
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
            if !self.delete(stale, None).await {
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
            // Kept as it is when already owed: a retry doubles the wait, not every failure.
            self.owed.entry(key).or_insert(Owed {
                due: Instant::now() + RETRY_INTERVAL,
                delay: RETRY_INTERVAL,
            });
        } else {
            self.owed.remove(&key);
        }
    }

    /// Counts, logs and writes a Warning Event on `app` for a workload write the API
    /// server refused for good.
    async fn announce_write_refusal(
        &mut self,
        app: &Value,
        workload: &Workload,
        refusal: &WriteRefusal,
    ) {
        let (kind, namespace, name) = workload.key();
        let refused = Refused {
            ordinal: workload.ordinal,
            reason: refusal.reason,
            message: format!(
                "the API server refused {kind} {namespace}/{name} ({}): {}; not tried again until the EdgeApplication or the {kind} changes",
                refusal.api_reason, refusal.message
            ),
            kind,
            api_version: workload.object["apiVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            namespace,
            name,
        };
        self.announce(app, &key_of(app), &refused, "WorkloadRefused")
            .await;
    }

    /// Counts, logs and writes an Event on `app` for each refusal not reported yet.
    async fn report(&mut self, app: &Value, key: &AppKey, refused: &[Refused]) {
        let now: BTreeSet<String> = refused.iter().map(|r| r.message.clone()).collect();
        let before = self.reported.insert(key.clone(), now).unwrap_or_default();
        for refused in refused {
            if before.contains(&refused.message) {
                continue;
            }
            self.announce(app, key, refused, "ManifestRefused").await;
        }
    }

    /// Counts, logs and writes a Warning Event (reason `event_reason`) on `app` for one
    /// refusal.
    async fn announce(&self, app: &Value, key: &AppKey, refused: &Refused, event_reason: &str) {
        self.metrics.refused(refused.reason);
        let (namespace, name) = key;
        tracing::warn!(%namespace, %name, reason = refused.reason, "EdgeApplication manifest refused: {}", refused.message);
        let event = refusal_event(app, refused, event_reason);
        match self.cluster.create(event).await {
            Ok(_) => self.metrics.count("event", true),
            Err(error) if error.status() == 409 => {}
            Err(error) => {
                tracing::warn!(%namespace, %name, %error, "cannot write the EdgeApplication's Event");
                self.metrics.count("event", false);
            }
        }
    }

    /// Creates `object`, or updates it when the cluster's copy differs. `known` is this
    /// workload's last refusal: while neither the application's spec (`app_hash`) nor the
    /// cluster's copy changed since, the write is not sent again.
    async fn write(&self, object: &Value, app_hash: u64, known: Option<&WriteRefusal>) -> Written {
        let kind = object["kind"].as_str().unwrap_or_default();
        let namespace = meta_str(object, "namespace");
        let name = meta_str(object, "name");
        let asked = object;
        let object = &stamped(object);
        let (current, write) = match self.cluster.get(kind, Some(namespace), name).await {
            Err(error) if error.status() == 404 => (None, Write::Create),
            Ok(current) if contains(&current, object) => return Written::Done,
            // Written by an edgehive before the annotation, and as asked: the annotation
            // alone is added, with a merge patch. A PUT of the manifest would drop what the
            // API server generated (a Job's `spec.selector` and template labels: 422).
            Ok(current) if !has_applied(&current) && contains(&current, asked) => {
                let version = meta_str(&current, "resourceVersion").to_owned();
                let patch = json!({"metadata": {
                    "resourceVersion": version,
                    "annotations": {APPLIED: object["metadata"]["annotations"][APPLIED]},
                }});
                (Some(version), Write::Annotate(patch))
            }
            Ok(current) => {
                let version = meta_str(&current, "resourceVersion").to_owned();
                let mut object = object.clone();
                object["metadata"]["resourceVersion"] = json!(version);
                (Some(version), Write::Update(object))
            }
            Err(error) => {
                tracing::warn!(%kind, %namespace, %name, %error, "cannot read an EdgeApplication's workload");
                self.metrics.count("workload", false);
                return Written::Failed;
            }
        };
        if let Some(known) = known {
            if known.app == app_hash && known.current == current {
                return Written::Refused(known.clone());
            }
        }
        let written = match write {
            Write::Create => self.cluster.create(object.clone()).await,
            Write::Update(update) => self.cluster.update(update).await,
            Write::Annotate(patch) => {
                self.cluster
                    .patch(kind, Some(namespace), name, patch, false)
                    .await
            }
        };
        self.written(written, kind, namespace, name, app_hash, current)
    }

    /// How a workload write went, counted: done, refused for good, or failed.
    fn written(
        &self,
        written: Result<Value, crate::cloud::cluster::ClusterError>,
        kind: &str,
        namespace: &str,
        name: &str,
        app_hash: u64,
        current: Option<String>,
    ) -> Written {
        match written {
            Ok(_) => {
                self.metrics.count("workload", true);
                Written::Done
            }
            Err(error) => match refusal_reason(error.status()) {
                Some(reason) => {
                    self.metrics.count_as("workload", "refused", 1);
                    Written::Refused(WriteRefusal {
                        reason,
                        api_reason: error.reason().to_owned(),
                        message: error.message(),
                        app: app_hash,
                        current,
                    })
                }
                None => {
                    tracing::warn!(%kind, %namespace, %name, %error, "cannot write an EdgeApplication's workload");
                    self.metrics.count("workload", false);
                    Written::Failed
                }
            },
        }
    }
}

/// A Warning Event on `app` saying why a manifest is not made or a workload not written
/// (`kubectl describe` shows it), named after the application and the refusal, so the same
/// refusal is one Event.
fn refusal_event(app: &Value, refused: &Refused, reason: &str) -> Value {
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
        "reason": reason,
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
    fn what_the_api_server_normalizes_quantities_and_empty_lists_is_no_difference_a_changed_value_is(
    ) {
        let mut asked = asked();
        let container = &mut asked["spec"]["template"]["spec"]["containers"][0];
        container["args"] = json!([]);
        container["resources"] = json!({"limits": {"cpu": 0.5, "memory": "1024Mi"},
            "requests": {"cpu": "100m", "ephemeral-storage": "1e9"}});
        asked["spec"]["template"]["spec"]["volumes"] =
            json!([{"name": "tmp", "emptyDir": {"sizeLimit": "0.5Gi"}}]);
        let written = stamped(&asked);
        let mut current = as_the_api_server_returns(&written);
        let container = &mut current["spec"]["template"]["spec"]["containers"][0];
        container.as_object_mut().unwrap().remove("args");
        container["resources"] = json!({"limits": {"cpu": "500m", "memory": "1Gi"},
            "requests": {"cpu": "100m", "ephemeral-storage": "1G"}});
        current["spec"]["template"]["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] = json!("512Mi");
        assert!(contains(&current, &written), "{current}");
        // Another value is a difference.
        let mut more = current.clone();
        more["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] =
            json!("600m");
        assert!(!contains(&more, &written));
        // args given where none were asked for is a difference; a quantity outside a
        // resources map is compared as written.
        let mut args = current.clone();
        args["spec"]["template"]["spec"]["containers"][0]["args"] = json!(["-v"]);
        assert!(!contains(&args, &written));
        assert!(!contains(&json!({"x": "500m"}), &json!({"x": 0.5})));
        assert_eq!(quantity(&json!("1.5")), quantity(&json!("1500m")));
        assert_eq!(quantity(&json!("1Ki")), Some(1024 * 1_000_000_000));
        assert_eq!(quantity(&json!("0.1n")), Some(1), "rounded up");
        assert_eq!(quantity(&json!("1Zi")), None);
        assert_eq!(quantity(&json!("")), None);
        assert_eq!(quantity(&json!("9e99")), None, "out of range");
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

#[cfg(test)]
mod refusal_tests {
    use std::sync::Arc;

    use super::*;
    use crate::cloud::cluster::{ClusterPort, EmbeddedCluster, FaultyCluster};

    /// An application of one Deployment manifest with selector `app: <app>`, for group east.
    fn application(app: &str, replicas: u64) -> Value {
        json!({
            "apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "EdgeApplication",
            "metadata": {"name": "shop", "namespace": "default"},
            "spec": {
                "workloadTemplate": {"manifests": [
                    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                     "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": app}},
                        "template": {"metadata": {"labels": {"app": app}},
                            "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}}}},
                ]},
                "workloadScope": {"targetNodeGroups": [{"name": "east"}]},
            },
        })
    }

    struct Fixture {
        faulty: FaultyCluster,
        watcher: ApplicationWatcher,
        metrics: Metrics,
    }

    impl Fixture {
        fn new() -> Self {
            let faulty = FaultyCluster::new(EmbeddedCluster::new());
            let metrics = Metrics::default();
            let cluster: SharedCluster = Arc::new(faulty.clone());
            let watcher = ApplicationWatcher::new(cluster, metrics.clone());
            Fixture {
                faulty,
                watcher,
                metrics,
            }
        }

        /// The application as the cluster has it now.
        async fn app(&self) -> Value {
            ClusterPort::get(&self.faulty, "EdgeApplication", Some("default"), "shop")
                .await
                .unwrap()
        }

        /// Writes `app` to the cluster (its spec) and hands the watcher the change.
        async fn change(&mut self, app: Value) {
            let stored = match ClusterPort::get(
                &self.faulty.inner,
                "EdgeApplication",
                Some("default"),
                "shop",
            )
            .await
            {
                Ok(mut stored) => {
                    stored["spec"] = app["spec"].clone();
                    ClusterPort::update(&self.faulty.inner, stored)
                        .await
                        .unwrap()
                }
                Err(_) => ClusterPort::create(&self.faulty.inner, app).await.unwrap(),
            };
            self.watcher
                .on_app(WatchEvent {
                    event_type: EventType::Modified,
                    object: stored,
                })
                .await;
        }

        /// Hands the watcher the application as the cluster has it (a status write's echo).
        async fn echo(&mut self) {
            let object = self.app().await;
            self.watcher
                .on_app(WatchEvent {
                    event_type: EventType::Modified,
                    object,
                })
                .await;
        }

        fn refused(&self, reason: &str) -> u64 {
            self.metrics
                .refused
                .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
                .get()
        }

        async fn warning_events(&self) -> Vec<Value> {
            let (events, _) = ClusterPort::list(&self.faulty.inner, "Event")
                .await
                .unwrap();
            events
                .into_iter()
                .filter(|event| event["reason"] == "WorkloadRefused")
                .collect()
        }
    }

    #[tokio::test]
    async fn a_workload_update_refused_with_422_is_reported_once_and_not_sent_again_until_the_application_changes(
    ) {
        let mut hub = Fixture::new();
        hub.change(application("web", 1)).await;
        let made = ClusterPort::get(&hub.faulty, "Deployment", Some("default"), "web-east")
            .await
            .unwrap();
        assert_eq!(made["spec"]["selector"]["matchLabels"]["app"], "web");
        assert_eq!(hub.faulty.writes("Deployment"), 1);

        // As a kube-apiserver: a Deployment's selector is immutable.
        hub.faulty.immutable("Deployment", "/spec/selector");
        hub.change(application("web2", 1)).await;
        assert_eq!(hub.faulty.writes("Deployment"), 2, "the update was tried");
        let app = hub.app().await;
        let entry = &app["status"]["workloadStatus"][0];
        assert_eq!(entry["identifier"]["name"], "web-east");
        assert_eq!(entry["conditions"], "Processing");
        assert_eq!(entry["reason"], "Invalid");
        assert!(
            entry["message"]
                .as_str()
                .unwrap()
                .contains("spec.selector: Invalid value"),
            "{entry}"
        );
        let events = hub.warning_events().await;
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0]["type"], "Warning");
        assert!(events[0]["message"]
            .as_str()
            .unwrap()
            .contains("field is immutable"));
        assert_eq!(hub.refused("invalid"), 1);

        // The status write's echoes and the retry timer: the refused update is not sent again.
        for _ in 0..3 {
            hub.echo().await;
        }
        hub.watcher
            .retry_due(Instant::now() + Duration::from_secs(3600))
            .await;
        assert_eq!(hub.faulty.writes("Deployment"), 2, "not sent again");
        assert!(
            hub.watcher.owed.is_empty(),
            "not owed: a retry cannot fix it"
        );
        assert!(hub.watcher.next_retry().is_none());
        assert_eq!(hub.refused("invalid"), 1, "counted once");
        assert_eq!(hub.warning_events().await.len(), 1);

        // The application changes (still the new selector): tried again, once.
        hub.change(application("web2", 2)).await;
        assert_eq!(
            hub.faulty.writes("Deployment"),
            3,
            "tried again on the change"
        );
        hub.echo().await;
        hub.echo().await;
        assert_eq!(hub.faulty.writes("Deployment"), 3, "once");
        assert_eq!(hub.refused("invalid"), 2);

        // The application goes back to the selector the Deployment has: written, Available.
        hub.change(application("web", 3)).await;
        assert_eq!(hub.faulty.writes("Deployment"), 4);
        let app = hub.app().await;
        let entry = &app["status"]["workloadStatus"][0];
        assert_eq!(entry["conditions"], "Available", "{entry}");
        assert!(entry.get("reason").is_none(), "{entry}");
        let made = ClusterPort::get(&hub.faulty, "Deployment", Some("default"), "web-east")
            .await
            .unwrap();
        assert_eq!(made["spec"]["replicas"], 3);
    }

    #[tokio::test]
    async fn a_workload_the_api_server_changed_since_the_refusal_is_tried_again() {
        let mut hub = Fixture::new();
        hub.change(application("web", 1)).await;
        hub.faulty.immutable("Deployment", "/spec/selector");
        hub.change(application("web2", 1)).await;
        assert_eq!(hub.faulty.writes("Deployment"), 2);
        // Someone deletes the Deployment (as an operator would, to change its selector).
        ClusterPort::delete(
            &hub.faulty.inner,
            "Deployment",
            Some("default"),
            "web-east",
            None,
        )
        .await
        .unwrap();
        hub.echo().await;
        assert_eq!(hub.faulty.writes("Deployment"), 3, "made anew");
        let made = ClusterPort::get(&hub.faulty, "Deployment", Some("default"), "web-east")
            .await
            .unwrap();
        assert_eq!(made["spec"]["selector"]["matchLabels"]["app"], "web2");
        let app = hub.app().await;
        assert_eq!(
            app["status"]["workloadStatus"][0]["conditions"],
            "Available"
        );
    }

    #[tokio::test]
    async fn transient_write_failures_are_retried_with_a_doubling_capped_backoff() {
        let mut hub = Fixture::new();
        hub.faulty.cut(true);
        hub.change(application("web", 1)).await;
        let key = ("default".to_owned(), "shop".to_owned());
        assert_eq!(hub.watcher.owed[&key].delay, RETRY_INTERVAL);
        let mut delays = Vec::new();
        let mut now = Instant::now();
        for _ in 0..8 {
            now = hub.watcher.owed[&key].due;
            hub.watcher.retry_due(now).await;
            delays.push(hub.watcher.owed[&key].delay.as_secs());
        }
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(
            hub.faulty.writes("Deployment"),
            0,
            "no write got through the cut"
        );
        // Not due yet: nothing tried.
        hub.faulty.cut(false);
        hub.watcher.retry_due(now).await;
        assert!(hub.watcher.owed.contains_key(&key));
        // Due: written, and the backoff forgotten.
        let due = hub.watcher.owed[&key].due;
        hub.watcher.retry_due(due).await;
        assert!(hub.watcher.owed.is_empty());
        assert_eq!(hub.faulty.writes("Deployment"), 1);
    }

    /// `app` as the cluster has it after a spec change another replica applied (this
    /// watcher not told), and the workloads that spec asks for.
    async fn changed_elsewhere(hub: &Fixture, app: Value) -> (Value, Vec<Workload>) {
        let mut stored = hub.app().await;
        stored["spec"] = app["spec"].clone();
        let stored = ClusterPort::update(&hub.faulty.inner, stored)
            .await
            .unwrap();
        let workloads = render(&stored).workloads;
        (stored, workloads)
    }

    /// `workload` as this controller writes it, made directly in the cluster.
    async fn made_directly(hub: &Fixture, workload: &Workload) -> Value {
        ClusterPort::create(&hub.faulty.inner, stamped(&workload.object))
            .await
            .unwrap()
    }

    async fn exists(hub: &Fixture, kind: &str, name: &str) -> bool {
        ClusterPort::get(&hub.faulty.inner, kind, Some("default"), name)
            .await
            .is_ok()
    }

    fn two_groups(app: &str) -> Value {
        let mut both = application(app, 1);
        both["spec"]["workloadScope"]["targetNodeGroups"] =
            json!([{"name": "east"}, {"name": "west"}]);
        both
    }

    #[tokio::test]
    async fn an_applications_workloads_are_deleted_with_what_they_own_in_the_background() {
        let mut hub = Fixture::new();
        hub.change(application("web", 1)).await;
        let app = hub.app().await;
        ClusterPort::delete(
            &hub.faulty.inner,
            "EdgeApplication",
            Some("default"),
            "shop",
            None,
        )
        .await
        .unwrap();
        hub.watcher
            .on_app(WatchEvent {
                event_type: EventType::Deleted,
                object: app,
            })
            .await;
        assert!(!exists(&hub, "Deployment", "web-east").await);
        let deletes = hub.faulty.deletes();
        assert_eq!(deletes.len(), 1, "{deletes:?}");
        assert_eq!(deletes[0].object, "Deployment/default/web-east");
        assert!(
            deletes[0].background,
            "a Job's pods would be orphaned: {deletes:?}"
        );
    }

    #[tokio::test]
    async fn the_start_sweep_keeps_a_users_copy_that_carries_the_owner_reference_and_deletes_only_what_edgehive_wrote(
    ) {
        let mut hub = Fixture::new();
        hub.change(application("web", 1)).await;
        let east = ClusterPort::get(&hub.faulty.inner, "Deployment", Some("default"), "web-east")
            .await
            .unwrap();
        let owner = east["metadata"]["ownerReferences"].clone();
        // A user's copy of the Deployment, ownerReference carried along, no annotation.
        let copy = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web-copy", "namespace": "default", "ownerReferences": owner},
            "spec": east["spec"]});
        ClusterPort::create(&hub.faulty.inner, copy).await.unwrap();
        // A per-group Service an older edgehive made.
        let legacy = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web-east", "namespace": "default", "ownerReferences": owner,
                "annotations": {SERVICE_TOPOLOGY: "range-nodegroup"}},
            "spec": {"selector": {"app": "web"}}});
        ClusterPort::create(&hub.faulty.inner, legacy)
            .await
            .unwrap();
        // A Deployment this controller wrote for a group dropped while the cloud was down.
        let west = render(&two_groups("web"))
            .workloads
            .into_iter()
            .find(|w| w.key().2 == "web-west")
            .unwrap();
        let mut west = west;
        west.object["metadata"]["ownerReferences"] = owner.clone();
        let west = made_directly(&hub, &west).await;

        hub.watcher.sweep(Instant::now()).await;
        assert!(
            exists(&hub, "Deployment", "web-copy").await,
            "the user's copy stays"
        );
        assert!(exists(&hub, "Deployment", "web-east").await);
        assert!(
            !exists(&hub, "Service", "web-east").await,
            "the old build's Service goes"
        );
        assert!(!exists(&hub, "Deployment", "web-west").await);
        assert!(hub.watcher.sweep_left.is_none());
        let west_delete = hub
            .faulty
            .deletes()
            .into_iter()
            .find(|d| d.object == "Deployment/default/web-west")
            .unwrap();
        assert_eq!(
            west_delete.uid.as_deref(),
            Some(meta_str(&west, "uid")),
            "only the incarnation listed"
        );
        assert!(west_delete.background);
    }

    #[tokio::test]
    async fn the_start_sweep_keeps_a_workload_another_replica_made_for_the_applications_newer_spec()
    {
        let mut hub = Fixture::new();
        hub.change(application("web", 1)).await;
        // Another replica applies the group the user just added; this one has not seen it.
        let (_, workloads) = changed_elsewhere(&hub, two_groups("web")).await;
        let west = workloads.iter().find(|w| w.key().2 == "web-west").unwrap();
        made_directly(&hub, west).await;

        hub.watcher.sweep(Instant::now()).await;
        assert!(
            exists(&hub, "Deployment", "web-west").await,
            "the application as read now asks for it"
        );
        assert!(exists(&hub, "Deployment", "web-east").await);
        assert_eq!(hub.faulty.deletes(), []);
    }

    #[tokio::test]
    async fn a_sweep_failure_that_recurs_is_retried_alone_with_a_doubling_capped_backoff() {
        let mut hub = Fixture::new();
        hub.change(application("web", 1)).await;
        let mut west = render(&two_groups("web"))
            .workloads
            .into_iter()
            .find(|w| w.key().2 == "web-west")
            .unwrap();
        let app = hub.app().await;
        west.object["metadata"]["ownerReferences"][0]["uid"] = json!(meta_str(&app, "uid"));
        made_directly(&hub, &west).await;
        // Its delete is refused by admission, every time; the first list (Deployments) fails once.
        hub.faulty.undeletable("Deployment", "web-west");
        hub.faulty.fail_lists(1);
        let (_, lists_before) = hub.faulty.counts();
        let now = Instant::now();
        hub.watcher.sweep(now).await;
        let (_, lists) = hub.faulty.counts();
        assert_eq!(lists - lists_before, WORKLOAD_KINDS.len());
        let left = hub.watcher.sweep_left.as_ref().unwrap();
        assert_eq!(left.lists, ["Deployment"]);
        assert_eq!(left.owed.delay, RETRY_INTERVAL);
        assert_eq!(hub.watcher.next_retry(), Some(now + RETRY_INTERVAL));

        let mut delays = Vec::new();
        for _ in 0..8 {
            let due = hub.watcher.sweep_left.as_ref().unwrap().owed.due;
            hub.watcher.retry_due(due).await;
            delays.push(
                hub.watcher
                    .sweep_left
                    .as_ref()
                    .unwrap()
                    .owed
                    .delay
                    .as_secs(),
            );
        }
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300, 300]);
        let (_, lists_after) = hub.faulty.counts();
        assert_eq!(lists_after - lists, 1, "only the failed list again, once");
        let tries = hub
            .faulty
            .deletes()
            .iter()
            .filter(|d| d.object == "Deployment/default/web-west")
            .count();
        assert_eq!(tries, 8, "the refused delete alone, once per retry");
        assert!(exists(&hub, "Deployment", "web-west").await);
    }

    #[tokio::test]
    async fn a_job_an_earlier_edgehive_made_gets_the_annotation_by_a_patch_not_a_put_that_drops_its_generated_selector(
    ) {
        let mut hub = Fixture::new();
        let job_app = json!({
            "apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "EdgeApplication",
            "metadata": {"name": "shop", "namespace": "default"},
            "spec": {"workloadTemplate": {"manifests": [
                {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "migrate"},
                 "spec": {"template": {"spec": {"restartPolicy": "Never",
                    "containers": [{"name": "m", "image": "migrate:1"}]}}}},
            ]}},
        });
        let stored = ClusterPort::create(&hub.faulty.inner, job_app.clone())
            .await
            .unwrap();
        // The Job as an earlier edgehive wrote it (no annotation), with what the API server
        // generated: the selector and the template's labels.
        let mut old = render(&stored).workloads[0].object.clone();
        let generated = json!({"batch.kubernetes.io/controller-uid": "c-1"});
        old["spec"]["selector"] = json!({"matchLabels": generated});
        old["spec"]["template"]["metadata"] = json!({"labels": generated});
        ClusterPort::create(&hub.faulty.inner, old).await.unwrap();
        hub.faulty.immutable("Job", "/spec/selector");
        hub.faulty.immutable("Job", "/spec/template");

        hub.change(job_app).await;
        let job = ClusterPort::get(&hub.faulty.inner, "Job", Some("default"), "migrate")
            .await
            .unwrap();
        assert!(has_applied(&job), "{job}");
        assert_eq!(job["spec"]["selector"]["matchLabels"], generated);
        assert_eq!(hub.refused("invalid"), 0);
        let app = hub.app().await;
        assert_eq!(
            app["status"]["workloadStatus"][0]["conditions"], "Available",
            "{app}"
        );
        assert_eq!(hub.faulty.writes("Job"), 1, "one patch");
        // Next event: as asked, nothing written.
        hub.echo().await;
        assert_eq!(hub.faulty.writes("Job"), 1);
    }

    #[tokio::test]
    async fn a_workload_the_api_server_normalized_gets_no_put_on_the_next_application_event() {
        let mut hub = Fixture::new();
        let mut app = application("web", 1);
        let container = &mut app["spec"]["workloadTemplate"]["manifests"][0]["spec"]["template"]
            ["spec"]["containers"][0];
        container["args"] = json!([]);
        container["resources"] = json!({"requests": {"cpu": 0.5, "memory": "1024Mi"}});
        hub.change(app).await;
        assert_eq!(hub.faulty.writes("Deployment"), 1);
        // As a kube-apiserver stores it: the quantities canonical, the empty list dropped.
        let mut stored =
            ClusterPort::get(&hub.faulty.inner, "Deployment", Some("default"), "web-east")
                .await
                .unwrap();
        let container = &mut stored["spec"]["template"]["spec"]["containers"][0];
        container.as_object_mut().unwrap().remove("args");
        container["resources"] = json!({"requests": {"cpu": "500m", "memory": "1Gi"}});
        ClusterPort::update(&hub.faulty.inner, stored)
            .await
            .unwrap();
        for _ in 0..3 {
            hub.echo().await;
        }
        assert_eq!(
            hub.faulty.writes("Deployment"),
            1,
            "no PUT of an unchanged workload"
        );
    }
}
