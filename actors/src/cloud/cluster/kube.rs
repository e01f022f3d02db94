//! The `kube` adapter of the [cluster port](super::ClusterPort): the controllers on a real
//! Kubernetes API server, through kube-rs.
//!
//! Objects stay JSON end to end ([`DynamicObject`] with the [`ApiResource`] of each kind), so
//! the controllers get the same wire-form objects as from the embedded cluster. The kinds
//! come from k8s-openapi's types (core kinds) and from [`super::crds`] (KubeEdge's custom
//! kinds); a kind outside `KINDS` is refused with a 422.
//!
//! Watches are [`kube::runtime::watcher`](mod@::kube::runtime::watcher) streams with kube's default backoff. A watcher
//! starts with a list and lists again after a desync (410 Gone, a dropped connection);
//! those lists are not passed on as events: when one is complete the stream yields
//! [`WatchError::Lagged`], which tells the controller to list itself and compare, exactly as
//! after a lagging embedded watch. So the first item of every watch is such a `Lagged`
//! (skipped = 0: the adapter does not know how many changes it stands for). Adds and updates
//! both arrive as kube's `Apply`; the stream remembers which names it has seen to tell
//! `Added` from `Modified`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use futures_util::FutureExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Endpoints, Event, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod,
    Secret, Service, ServiceAccount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    Preconditions, PropagationPolicy,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::{Client, Resource};
use serde_json::{json, Map, Value};

use super::crds::{
    ClusterObjectSync, Device, DeviceModel, DeviceStatus, ObjectSync, APPS_GROUP, RULES_GROUP,
};
use super::{ClusterError, ClusterFuture, ClusterPort, EventType, Watch, WatchError, WatchEvent};

/// How the cloud reaches the API server: KubeEdge's `kubeAPIConfig` keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeOptions {
    /// A kubeconfig file; `None` means the pod's in-cluster service account.
    pub kube_config: Option<PathBuf>,
    /// The API server URL, overriding the kubeconfig's (or the in-cluster one); empty: keep it.
    pub master: String,
}

/// Why the cloud cannot start on the API server. Every message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum KubeStartError {
    /// The kubeconfig could not be read or used.
    #[error("cannot use kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file from `kubeAPIConfig.kubeConfig`.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// No kubeconfig was given and the process is not in a pod.
    #[error(
        "no kubeconfig given and no in-cluster service account: {0}; set kubeAPIConfig.kubeConfig"
    )]
    InCluster(String),
    /// `kubeAPIConfig.master` is not a URL.
    #[error("kubeAPIConfig.master {master:?} is not a URL: {message}")]
    Master {
        /// The configured value.
        master: String,
        /// The parser's reason.
        message: String,
    },
    /// The API server did not answer.
    #[error("the Kubernetes API server at {url} is unreachable: {message} (check kubeAPIConfig and that the cluster is up)")]
    Unreachable {
        /// The server URL.
        url: String,
        /// The transport's reason.
        message: String,
    },
    /// A custom resource the controllers use is not served by the cluster.
    #[error("the cluster has no CustomResourceDefinition {crd} (kind {kind}, {api_version}); install the CRDs with `kubectl apply -f config/crds/`")]
    MissingCrd {
        /// The CRD's name, e.g. `devices.devices.kubeedge.io`.
        crd: String,
        /// The kind, e.g. `Device`.
        kind: String,
        /// Its `apiVersion`.
        api_version: String,
    },
    /// The API server answered the start-up checks with an error.
    #[error("the Kubernetes API server refused a start-up check ({check}): {error}")]
    Refused {
        /// What was being checked.
        check: String,
        /// The API server's answer.
        error: ClusterError,
    },
}

/// How long the start-up checks wait for the API server before calling it unreachable.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(15);

/// What the adapter knows about one kind.
#[derive(Debug, Clone)]
pub struct KindInfo {
    /// Group, version, kind and plural.
    pub resource: ApiResource,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Whether the API has a `status` subresource for it (otherwise status is written
    /// through the object itself).
    pub status_subresource: bool,
    /// The CRD's name for custom kinds (`{plural}.{group}`), `None` for built-in ones.
    pub crd: Option<String>,
}

fn builtin<K>(namespaced: bool, status_subresource: bool) -> KindInfo
where
    K: Resource<DynamicType = ()>,
{
    KindInfo {
        resource: ApiResource::erase::<K>(&()),
        namespaced,
        status_subresource,
        crd: None,
    }
}

fn custom<K>(namespaced: bool, status_subresource: bool) -> KindInfo
where
    K: Resource<DynamicType = ()>,
{
    let resource = ApiResource::erase::<K>(&());
    let crd = Some(format!("{}.{}", resource.plural, resource.group));
    KindInfo {
        resource,
        namespaced,
        status_subresource,
        crd,
    }
}

/// A kind whose CRD is KubeEdge's own file, copied as is into `config/crds/` (no Rust type
/// generates it): its API facts are spelled here.
fn copied(
    group: &str,
    kind: &str,
    plural: &str,
    namespaced: bool,
    status_subresource: bool,
) -> KindInfo {
    let version = if group == RULES_GROUP {
        super::crds::RULES_VERSION
    } else {
        super::crds::APPS_VERSION
    };
    KindInfo {
        resource: ApiResource {
            group: group.to_owned(),
            version: version.to_owned(),
            api_version: format!("{group}/{version}"),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
        },
        namespaced,
        status_subresource,
        crd: Some(format!("{plural}.{group}")),
    }
}

/// Every kind the controllers read or write, by kind name.
pub const KINDS: &[&str] = &[
    "Pod",
    "Node",
    "ConfigMap",
    "Secret",
    "ServiceAccount",
    "Namespace",
    "Service",
    "Endpoints",
    "EndpointSlice",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "Event",
    "VolumeAttachment",
    "Lease",
    "Device",
    "DeviceModel",
    "DeviceStatus",
    "ObjectSync",
    "ClusterObjectSync",
    "NodeGroup",
    "EdgeApplication",
    "Deployment",
    "DaemonSet",
    "StatefulSet",
    "Job",
    "Rule",
    "RuleEndpoint",
];

/// The adapter's facts about `kind`, if it is one of `KINDS`.
pub fn kind_info(kind: &str) -> Option<KindInfo> {
    // Scope and status subresources as the API server defines them (for the custom kinds:
    // as KubeEdge's CRDs and ours in config/crds/ define them).
    Some(match kind {
        "Pod" => builtin::<Pod>(true, true),
        "Node" => builtin::<Node>(false, true),
        "ConfigMap" => builtin::<ConfigMap>(true, false),
        "Secret" => builtin::<Secret>(true, false),
        "ServiceAccount" => builtin::<ServiceAccount>(true, false),
        "Namespace" => builtin::<Namespace>(false, true),
        // Read by DynamicController for an edge's MetaServer.
        "Service" => builtin::<Service>(true, true),
        "Endpoints" => builtin::<Endpoints>(true, false),
        "EndpointSlice" => builtin::<EndpointSlice>(true, false),
        "PersistentVolume" => builtin::<PersistentVolume>(false, true),
        "PersistentVolumeClaim" => builtin::<PersistentVolumeClaim>(true, true),
        "Event" => builtin::<Event>(true, false),
        "VolumeAttachment" => builtin::<VolumeAttachment>(false, true),
        "Lease" => builtin::<Lease>(true, false),
        "Device" => custom::<Device>(true, false),
        "DeviceModel" => custom::<DeviceModel>(true, false),
        "DeviceStatus" => custom::<DeviceStatus>(true, false),
        "ObjectSync" => custom::<ObjectSync>(true, true),
        "ClusterObjectSync" => custom::<ClusterObjectSync>(false, true),
        // Made by the EdgeApplication controller for each target node group.
        "Deployment" => builtin::<Deployment>(true, true),
        // Made once as given by the EdgeApplication controller (`WORKLOAD_KINDS`).
        "DaemonSet" => builtin::<DaemonSet>(true, true),
        "StatefulSet" => builtin::<StatefulSet>(true, true),
        "Job" => builtin::<Job>(true, true),
        "NodeGroup" => copied(APPS_GROUP, "NodeGroup", "nodegroups", false, true),
        "EdgeApplication" => copied(
            APPS_GROUP,
            "EdgeApplication",
            "edgeapplications",
            true,
            true,
        ),
        // KubeEdge's Rule CRD has no status subresource: its status is patched on the object.
        "Rule" => copied(RULES_GROUP, "Rule", "rules", true, false),
        "RuleEndpoint" => copied(RULES_GROUP, "RuleEndpoint", "ruleendpoints", true, false),
        _ => return None,
    })
}

/// The custom kinds the NodeGroup and EdgeApplication controllers need (checked at start).
pub const NODE_GROUP_KINDS: &[&str] = &["NodeGroup", "EdgeApplication"];

/// The custom kinds the DeviceController needs (checked at start).
pub const DEVICE_KINDS: &[&str] = &["Device", "DeviceModel", "DeviceStatus"];

/// The cluster port on a Kubernetes API server. Cheap to clone (the client is shared).
#[derive(Clone)]
pub struct KubeCluster {
    client: Client,
}

impl std::fmt::Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster").finish_non_exhaustive()
    }
}

impl From<KubeCluster> for super::SharedCluster {
    fn from(cluster: KubeCluster) -> Self {
        std::sync::Arc::new(cluster)
    }
}

fn unknown_kind(kind: &str) -> ClusterError {
    ClusterError::Invalid(format!(
        "kind {kind} is not one the kube adapter knows ({})",
        KINDS.join(", ")
    ))
}

fn display_key(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_owned(),
    }
}

/// Turns kube's error into the port's, keeping the API server's code, reason and message.
pub(crate) fn cluster_error(kind: &str, key: &str, error: kube::Error) -> ClusterError {
    match error {
        kube::Error::Api(status) => match (status.code, status.reason.as_str()) {
            (404, _) => ClusterError::NotFound {
                kind: kind.to_owned(),
                key: key.to_owned(),
            },
            (409, "AlreadyExists") => ClusterError::AlreadyExists {
                kind: kind.to_owned(),
                key: key.to_owned(),
            },
            (code, reason) => ClusterError::Api {
                code,
                reason: reason.to_owned(),
                message: status.message.clone(),
            },
        },
        kube::Error::SerdeError(err) => ClusterError::Api {
            code: 500,
            reason: "InternalError".into(),
            message: format!("cannot decode the API server's answer: {err}"),
        },
        other => ClusterError::Unavailable(with_sources(&other)),
    }
}

/// `error` with its sources ("client error (Connect): tcp connect error: Connection refused"),
/// since kube's own text often stops before the reason.
fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The object as the port hands it out: JSON with `apiVersion` and `kind` first (list items
/// come without them from the API server).
fn to_value(resource: &ApiResource, object: DynamicObject) -> Result<Value, ClusterError> {
    let value = serde_json::to_value(&object)
        .map_err(|err| ClusterError::Invalid(format!("cannot encode {}: {err}", resource.kind)))?;
    let mut out = Map::new();
    out.insert("apiVersion".into(), json!(resource.api_version));
    out.insert("kind".into(), json!(resource.kind));
    if let Value::Object(map) = value {
        for (key, value) in map {
            if key != "apiVersion" && key != "kind" {
                out.insert(key, value);
            }
        }
    }
    Ok(Value::Object(out))
}

/// The parts of an object the adapter needs to address it.
struct Target {
    info: KindInfo,
    kind: String,
    namespace: Option<String>,
    name: String,
    object: DynamicObject,
}

impl Target {
    fn key(&self) -> String {
        display_key(self.namespace.as_deref(), &self.name)
    }
}

impl KubeCluster {
    /// The adapter on an existing client (tests pass one over a mock service).
    pub fn from_client(client: Client) -> Self {
        KubeCluster { client }
    }

    /// Builds a client from `options` and runs [`Self::check`] for `required_kinds`.
    pub async fn connect(
        options: &KubeOptions,
        required_kinds: &[&str],
    ) -> Result<Self, KubeStartError> {
        let mut config = match &options.kube_config {
            Some(path) => load_kubeconfig(path).await?,
            None => kube::Config::incluster()
                .map_err(|err| KubeStartError::InCluster(err.to_string()))?,
        };
        if !options.master.is_empty() {
            config.cluster_url = match options.master.parse() {
                Ok(url) => url,
                Err(err) => {
                    return Err(KubeStartError::Master {
                        master: options.master.clone(),
                        message: format!("{err}"),
                    })
                }
            };
        }
        let url = config.cluster_url.to_string();
        let client = Client::try_from(config).map_err(|err| KubeStartError::Unreachable {
            url: url.clone(),
            message: err.to_string(),
        })?;
        let cluster = KubeCluster::from_client(client);
        cluster.check(&url, required_kinds).await?;
        Ok(cluster)
    }

    /// Checks that the API server answers (its version) and serves every kind in
    /// `required_kinds` (API discovery of the kind's group/version, which every
    /// authenticated user may read). `url` only names the server in errors.
    pub async fn check(&self, url: &str, required_kinds: &[&str]) -> Result<(), KubeStartError> {
        let unreachable = |message: String| KubeStartError::Unreachable {
            url: url.to_owned(),
            message,
        };
        let version = tokio::time::timeout(START_TIMEOUT, self.client.apiserver_version())
            .await
            .map_err(|_| unreachable(format!("no answer within {START_TIMEOUT:?}")))?;
        match version {
            Ok(info) => tracing::info!(%url, version = %info.git_version, "Kubernetes API server"),
            Err(kube::Error::Api(status)) => {
                return Err(KubeStartError::Refused {
                    check: "GET /version".into(),
                    error: cluster_error("version", "", kube::Error::Api(status)),
                })
            }
            Err(err) => return Err(unreachable(with_sources(&err))),
        }
        // One discovery request per group/version; the served plurals answer for its kinds.
        let mut served: std::collections::HashMap<String, Vec<String>> = Default::default();
        for kind in required_kinds {
            let info = kind_info(kind).ok_or_else(|| KubeStartError::Refused {
                check: format!("kind {kind}"),
                error: unknown_kind(kind),
            })?;
            let api_version = info.resource.api_version.clone();
            let missing = || KubeStartError::MissingCrd {
                crd: info
                    .crd
                    .clone()
                    .unwrap_or_else(|| info.resource.plural.clone()),
                kind: (*kind).to_owned(),
                api_version: api_version.clone(),
            };
            if !served.contains_key(&api_version) {
                let answer = tokio::time::timeout(
                    START_TIMEOUT,
                    self.client.list_api_group_resources(&api_version),
                )
                .await
                .map_err(|_| unreachable(format!("no answer within {START_TIMEOUT:?}")))?;
                let plurals = match answer {
                    Ok(list) => list.resources.into_iter().map(|r| r.name).collect(),
                    Err(kube::Error::Api(status)) if status.code == 404 => return Err(missing()),
                    Err(kube::Error::Api(status)) => {
                        return Err(KubeStartError::Refused {
                            check: format!("discovery of {api_version}"),
                            error: cluster_error(kind, "", kube::Error::Api(status)),
                        })
                    }
                    Err(err) => return Err(unreachable(with_sources(&err))),
                };
                served.insert(api_version.clone(), plurals);
            }
            let plurals = served
                .get(&api_version)
                .map(Vec::as_slice)
                .unwrap_or_default();
            if !plurals.contains(&info.resource.plural) {
                return Err(missing());
            }
        }
        Ok(())
    }

    fn api(&self, info: &KindInfo, namespace: Option<&str>) -> Api<DynamicObject> {
        match namespace {
            Some(ns) if info.namespaced => {
                Api::namespaced_with(self.client.clone(), ns, &info.resource)
            }
            _ => Api::all_with(self.client.clone(), &info.resource),
        }
    }

    /// The kind's facts and the namespace to use (`default` for namespaced kinds without
    /// one, none for cluster-scoped kinds), as the embedded cluster does.
    fn locate(
        kind: &str,
        namespace: Option<&str>,
    ) -> Result<(KindInfo, Option<String>), ClusterError> {
        let info = kind_info(kind).ok_or_else(|| unknown_kind(kind))?;
        let namespace = info.namespaced.then(|| {
            namespace
                .filter(|ns| !ns.is_empty())
                .unwrap_or("default")
                .to_owned()
        });
        Ok((info, namespace))
    }

    /// Validates `obj` the way the embedded cluster does (kind and name required) and sets
    /// its namespace.
    fn target(obj: Value) -> Result<Target, ClusterError> {
        let kind = match obj.get("kind") {
            Some(Value::String(kind)) if !kind.is_empty() => kind.clone(),
            _ => return Err(ClusterError::Invalid("missing kind".into())),
        };
        let mut object: DynamicObject = serde_json::from_value(obj)
            .map_err(|err| ClusterError::Invalid(format!("{kind}: {err}")))?;
        let name = match &object.metadata.name {
            Some(name) if !name.is_empty() => name.clone(),
            _ => {
                return Err(ClusterError::Invalid(format!(
                    "{kind}: missing metadata.name"
                )))
            }
        };
        let (info, namespace) = Self::locate(&kind, object.metadata.namespace.as_deref())?;
        object.metadata.namespace = namespace.clone();
        Ok(Target {
            info,
            kind,
            namespace,
            name,
            object,
        })
    }

    /// Deletes the object with `params`.
    fn delete_with(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        params: DeleteParams,
    ) -> ClusterFuture<Value> {
        let (info, namespace) = match Self::locate(kind, namespace) {
            Ok(found) => found,
            Err(err) => return fail(err),
        };
        let api = self.api(&info, namespace.as_deref());
        let (kind, name) = (kind.to_owned(), name.to_owned());
        async move {
            let key = display_key(namespace.as_deref(), &name);
            let deleted = api
                .delete(&name, &params)
                .await
                .map_err(|err| cluster_error(&kind, &key, err))?;
            // The object while it is being deleted (finalizers, grace), or the API's Status.
            deleted.either(
                |object| to_value(&info.resource, object),
                |status| {
                    serde_json::to_value(status)
                        .map_err(|err| ClusterError::Invalid(err.to_string()))
                },
            )
        }
        .boxed()
    }
}

async fn load_kubeconfig(path: &Path) -> Result<kube::Config, KubeStartError> {
    let error = |message: String| KubeStartError::Kubeconfig {
        path: path.display().to_string(),
        message,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(|err| error(err.to_string()))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|err| error(err.to_string()))
}

fn fail<T: Send + 'static>(error: ClusterError) -> ClusterFuture<T> {
    Box::pin(futures_util::future::ready(Err(error)))
}

impl ClusterPort for KubeCluster {
    fn adapter(&self) -> &'static str {
        "kube"
    }

    fn version(&self) -> ClusterFuture<Value> {
        let client = self.client.clone();
        Box::pin(async move {
            let info = client
                .apiserver_version()
                .await
                .map_err(|err| ClusterError::Unavailable(err.to_string()))?;
            serde_json::to_value(info).map_err(|err| ClusterError::Invalid(err.to_string()))
        })
    }

    fn get(&self, kind: &str, namespace: Option<&str>, name: &str) -> ClusterFuture<Value> {
        let (info, namespace) = match Self::locate(kind, namespace) {
            Ok(found) => found,
            Err(err) => return fail(err),
        };
        let api = self.api(&info, namespace.as_deref());
        let (kind, name) = (kind.to_owned(), name.to_owned());
        async move {
            let key = display_key(namespace.as_deref(), &name);
            let object = api
                .get(&name)
                .await
                .map_err(|err| cluster_error(&kind, &key, err))?;
            to_value(&info.resource, object)
        }
        .boxed()
    }

    fn list(&self, kind: &str) -> ClusterFuture<(Vec<Value>, String)> {
        let Some(info) = kind_info(kind) else {
            return fail(unknown_kind(kind));
        };
        let api = self.api(&info, None);
        let kind = kind.to_owned();
        async move {
            let list = api
                .list(&ListParams::default())
                .await
                .map_err(|err| cluster_error(&kind, "", err))?;
            let rv = list.metadata.resource_version.unwrap_or_default();
            let items = list
                .items
                .into_iter()
                .map(|item| to_value(&info.resource, item))
                .collect::<Result<Vec<_>, _>>()?;
            Ok((items, rv))
        }
        .boxed()
    }

    fn watch(&self, kind: &str) -> Watch {
        let Some(info) = kind_info(kind) else {
            tracing::error!(kind, "cannot watch a kind the kube adapter does not know");
            return Box::pin(stream::empty());
        };
        let api = self.api(&info, None);
        let events = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let state = WatchState {
            info,
            seen: HashSet::new(),
            relisting: None,
        };
        Box::pin(stream::unfold(
            (events, state),
            |(mut events, mut state)| async move {
                loop {
                    let event = events.next().await?;
                    if let Some(item) = state.map(event) {
                        return Some((item, (events, state)));
                    }
                }
            },
        ))
    }

    fn create(&self, obj: Value) -> ClusterFuture<Value> {
        let target = match Self::target(obj) {
            Ok(target) => target,
            Err(err) => return fail(err),
        };
        let api = self.api(&target.info, target.namespace.as_deref());
        async move {
            let created = api
                .create(&PostParams::default(), &target.object)
                .await
                .map_err(|err| cluster_error(&target.kind, &target.key(), err))?;
            to_value(&target.info.resource, created)
        }
        .boxed()
    }

    fn update(&self, obj: Value) -> ClusterFuture<Value> {
        let target = match Self::target(obj) {
            Ok(target) => target,
            Err(err) => return fail(err),
        };
        let api = self.api(&target.info, target.namespace.as_deref());
        async move {
            let updated = api
                .replace(&target.name, &PostParams::default(), &target.object)
                .await
                .map_err(|err| cluster_error(&target.kind, &target.key(), err))?;
            to_value(&target.info.resource, updated)
        }
        .boxed()
    }

    fn update_status(&self, obj: Value) -> ClusterFuture<Value> {
        let status = obj.get("status").cloned().unwrap_or(Value::Null);
        let target = match Self::target(obj) {
            Ok(target) => target,
            Err(err) => return fail(err),
        };
        let api = self.api(&target.info, target.namespace.as_deref());
        async move {
            let error = |err| cluster_error(&target.kind, &target.key(), err);
            let updated = if target.info.status_subresource {
                api.replace_status(&target.name, &PostParams::default(), &target.object)
                    .await
                    .map_err(error)?
            } else {
                // No subresource: only the status may change, so write it onto the current
                // object (a concurrent write surfaces as the replace's 409).
                let mut current = api.get(&target.name).await.map_err(error)?;
                match &mut current.data {
                    Value::Object(map) => {
                        map.insert("status".into(), status);
                    }
                    other => *other = json!({ "status": status }),
                }
                api.replace(&target.name, &PostParams::default(), &current)
                    .await
                    .map_err(error)?
            };
            to_value(&target.info.resource, updated)
        }
        .boxed()
    }

    fn patch(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        patch: Value,
        status_only: bool,
    ) -> ClusterFuture<Value> {
        if !patch.is_object() {
            return fail(ClusterError::Invalid(
                "a patch must be a JSON object".into(),
            ));
        }
        let (info, namespace) = match Self::locate(kind, namespace) {
            Ok(found) => found,
            Err(err) => return fail(err),
        };
        let api = self.api(&info, namespace.as_deref());
        let (kind, name) = (kind.to_owned(), name.to_owned());
        async move {
            let key = display_key(namespace.as_deref(), &name);
            let params = PatchParams::default();
            let patched = if !status_only {
                api.patch(&name, &params, &Patch::Merge(&patch)).await
            } else if info.status_subresource {
                api.patch_status(&name, &params, &Patch::Merge(&patch))
                    .await
            } else {
                // Status-only without a subresource: send the status part alone.
                let status = json!({"status": patch.get("status").cloned().unwrap_or(json!({}))});
                api.patch(&name, &params, &Patch::Merge(&status)).await
            };
            let patched = patched.map_err(|err| cluster_error(&kind, &key, err))?;
            to_value(&info.resource, patched)
        }
        .boxed()
    }

    fn delete(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        uid: Option<&str>,
    ) -> ClusterFuture<Value> {
        // With a UID (an edge deleting its pod, as KubeEdge does): at once and only that
        // incarnation of the object.
        let params = match uid {
            Some(uid) => DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.to_owned()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            },
            None => DeleteParams::default(),
        };
        self.delete_with(kind, namespace, name, params)
    }

    fn delete_owner(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        uid: Option<&str>,
    ) -> ClusterFuture<Value> {
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: uid.map(|uid| Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        self.delete_with(kind, namespace, name, params)
    }

    fn create_token(&self, namespace: &str, name: &str, request: Value) -> ClusterFuture<Value> {
        let Some(info) = kind_info("ServiceAccount") else {
            return fail(unknown_kind("ServiceAccount"));
        };
        let api = self.api(&info, Some(namespace));
        let key = display_key(Some(namespace), name);
        let name = name.to_owned();
        async move {
            let mut request = request;
            if !request.is_object() {
                request = json!({});
            }
            request["apiVersion"] = json!("authentication.k8s.io/v1");
            request["kind"] = json!("TokenRequest");
            api.create_subresource::<Value, Value>("token", &name, &PostParams::default(), &request)
                .await
                .map_err(|err| cluster_error("ServiceAccount", &key, err))
        }
        .boxed()
    }
}

/// Per-watch memory: which objects exist, to tell adds from updates.
struct WatchState {
    info: KindInfo,
    /// (namespace or "", name) of the objects this watch knows.
    seen: HashSet<(String, String)>,
    /// The names listed so far while the watcher lists again.
    relisting: Option<HashSet<(String, String)>>,
}

impl WatchState {
    fn key(object: &DynamicObject) -> (String, String) {
        (
            object.metadata.namespace.clone().unwrap_or_default(),
            object.metadata.name.clone().unwrap_or_default(),
        )
    }

    fn event(
        &self,
        event_type: EventType,
        object: DynamicObject,
    ) -> Option<Result<WatchEvent, WatchError>> {
        match to_value(&self.info.resource, object) {
            Ok(object) => Some(Ok(WatchEvent { event_type, object })),
            Err(error) => {
                tracing::warn!(kind = %self.info.resource.kind, %error, "dropping a watch event");
                None
            }
        }
    }

    /// The port's item for one watcher event, if it makes one.
    fn map(
        &mut self,
        event: Result<watcher::Event<DynamicObject>, watcher::Error>,
    ) -> Option<Result<WatchEvent, WatchError>> {
        match event {
            Ok(watcher::Event::Apply(object)) => {
                let event_type = if self.seen.insert(Self::key(&object)) {
                    EventType::Added
                } else {
                    EventType::Modified
                };
                self.event(event_type, object)
            }
            Ok(watcher::Event::Delete(object)) => {
                self.seen.remove(&Self::key(&object));
                self.event(EventType::Deleted, object)
            }
            Ok(watcher::Event::Init) => {
                self.relisting = Some(HashSet::new());
                None
            }
            Ok(watcher::Event::InitApply(object)) => {
                self.relisting
                    .get_or_insert_with(HashSet::new)
                    .insert(Self::key(&object));
                None
            }
            Ok(watcher::Event::InitDone) => {
                self.seen = self.relisting.take().unwrap_or_default();
                // The controller lists now; changes after the watcher's list follow as events.
                Some(Err(WatchError::Lagged { skipped: 0 }))
            }
            Err(error) => {
                // The backoff retries; the watcher lists again if it has to.
                tracing::warn!(kind = %self.info.resource.kind, %error, "watch failed; retrying");
                None
            }
        }
    }
}
