//! The typed messages that cross module boundaries on the cloud side.
//!
//! Only CloudHub converts between the beehive [`Message`] on the wire and these types, and
//! the beehive messages controllers send are built here (`downstream`, and `request`'s
//! replies), never in the controllers; the controllers hand CloudHub a [`NodeMessage`] (built once per change, encoded once, shared by
//! every node that gets it) inside [`ToNodes`], and CloudHub hands EdgeController typed
//! `request::EdgeRequest`s. Modules address each other by the names in [`route`] and the
//! message type (`Hive::tell`), never by actor type. Extension modules talk to edges through
//! [`extension`]: the upstream groups they claim, the messages they send nodes.

pub(crate) mod application;
pub(crate) mod downstream;
pub mod extension;
mod object_id;
pub mod ownership;
pub(crate) mod request;
pub(crate) mod twin;

pub(crate) use downstream::object_message;
pub use object_id::ObjectId;

use std::sync::Arc;

use actix::Message as ActixMessage;
use bytestring::ByteString;
use edgehive_protocols::{
    encode, trim_for_edge, CloudResource, Group, Message, ModuleName, Operation, ResourceType,
};

/// Which of a node's two delivery lanes a message takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// One entry per object, newest version wins, resent until the edge ACKs it.
    Ack,
    /// Written once, in order, no ACK expected.
    NoAck,
}

/// A message for edge nodes: what the pools need to know about it, and its wire frame,
/// encoded once. Cheap to share: nodes hold it as `Arc<NodeMessage>`, and a resend writes the
/// same bytes again.
#[derive(Debug, PartialEq, Eq)]
pub struct NodeMessage {
    id: String,
    key: String,
    operation: Option<Operation>,
    resource_version: Option<String>,
    resource: String,
    lane: Lane,
    delete: bool,
    deleting: bool,
    response: bool,
    resend: bool,
    tracked: bool,
    refresh: bool,
    object: Option<Arc<ObjectId>>,
    frame: ByteString,
}

impl NodeMessage {
    /// Reads `message` (resource in cloud form, `node/{node}/…`, or already in edge form)
    /// once: its lane by KubeEdge's rules (`needs_ack`), its object key, and its frame.
    pub fn new(message: &Message) -> Arc<Self> {
        Self::with_lane(message.clone(), needs_ack(message))
    }

    /// [`NodeMessage::new`] for a message the caller is done with: its object is encoded
    /// where it lies, not copied first.
    pub fn from_owned(message: Message) -> Arc<Self> {
        let ack = needs_ack(&message);
        Self::with_lane(message, ack)
    }

    /// Like [`NodeMessage::new`], but always the no-ACK lane (CloudHub's own refusals).
    pub(crate) fn no_ack(message: &Message) -> Arc<Self> {
        Self::with_lane(message.clone(), false)
    }

    /// SyncController's resend of what the cluster has and the edge has not acknowledged: a
    /// pool never drops it because it remembers that version as ACKed (the record says
    /// otherwise, so the edge is asked again and its ACK fixes the record).
    pub fn resend(message: Message) -> Arc<Self> {
        let ack = needs_ack(&message);
        let mut built = Self::with_lane(message, ack);
        if let Some(built) = Arc::get_mut(&mut built) {
            built.resend = true;
        }
        built
    }

    /// A watch's push ([`application::watch_push`]): KubeEdge's lane, but neither recorded by
    /// SyncController when queued or ACKed, nor granting the node the object
    /// (CloudHub's bound objects): it is owed to the node only while its watch lasts.
    pub(crate) fn untracked(message: Message) -> Arc<Self> {
        let ack = needs_ack(&message);
        let mut built = Self::with_lane(message, ack);
        if let Some(built) = Arc::get_mut(&mut built) {
            built.tracked = false;
        }
        built
    }

    /// A watch's push of a view that changed while the object did not (the service-topology
    /// filter after a node changed group): [`NodeMessage::untracked`], and it goes at the
    /// version the node has (ACKed, pending or in flight), replacing what is pending.
    pub(crate) fn refresh(message: Message) -> Arc<Self> {
        let ack = needs_ack(&message);
        let mut built = Self::with_lane(message, ack);
        if let Some(built) = Arc::get_mut(&mut built) {
            built.tracked = false;
            built.refresh = true;
        }
        built
    }

    fn with_lane(mut wire: Message, ack: bool) -> Arc<Self> {
        let object = ObjectId::of(&wire);
        let operation = wire.operation().cloned();
        let key = ack_key(&wire);
        let deleting = operation == Some(Operation::Delete)
            || !wire.content["metadata"]["deletionTimestamp"].is_null();
        let resource_version = wire
            .resource_version()
            .filter(|rv| !rv.is_empty())
            .map(str::to_owned);
        wire.route.resource = trim_for_edge(&wire.route.resource);
        wire.header.sync = false;
        let frame = ByteString::from(encode(&wire));
        Arc::new(NodeMessage {
            id: wire.header.id,
            key,
            delete: operation == Some(Operation::Delete),
            deleting,
            response: operation == Some(Operation::Response),
            resend: false,
            tracked: true,
            refresh: false,
            object,
            operation,
            resource_version,
            resource: wire.route.resource,
            lane: if ack { Lane::Ack } else { Lane::NoAck },
            frame,
        })
    }

    /// The msg_id the edge ACKs (its `parentID`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The object key of the ACK lane: the object's UID, or the resource when it has none.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The operation, if the message has one.
    pub fn operation(&self) -> Option<&Operation> {
        self.operation.as_ref()
    }

    /// The object's resourceVersion (`None` when absent or empty).
    pub fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    /// The resource in edge form (`{ns}/{type}/{name}`).
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// Which lane it takes.
    pub fn lane(&self) -> Lane {
        self.lane
    }

    /// Whether it is a `delete`.
    pub(crate) fn is_delete(&self) -> bool {
        self.delete
    }

    /// Whether it deletes its object or the object is being deleted (such messages may come
    /// without a resourceVersion and are never dropped as stale).
    pub(crate) fn is_deleting(&self) -> bool {
        self.deleting
    }

    /// Whether it is a reply to an edge request.
    pub fn is_response(&self) -> bool {
        self.response
    }

    /// Whether it is SyncController's resend ([`NodeMessage::resend`]).
    pub(crate) fn is_resend(&self) -> bool {
        self.resend
    }

    /// Whether it is a watch's corrected view at the same version ([`NodeMessage::refresh`]).
    pub(crate) fn is_refresh(&self) -> bool {
        self.refresh
    }

    /// Whether SyncController records it and its ACK binds the object to the node (all but a
    /// watch's pushes, [`NodeMessage::untracked`]).
    pub(crate) fn is_tracked(&self) -> bool {
        self.tracked
    }

    /// The Kubernetes object it carries, if any ([`ObjectId::of`]).
    pub fn object(&self) -> Option<&Arc<ObjectId>> {
        self.object.as_ref()
    }

    /// The encoded frame, exactly as written to every node that gets it.
    pub fn frame(&self) -> &ByteString {
        &self.frame
    }
}

/// Messages for nodes, from a cloud controller to CloudHub: one change, encoded once, for
/// every node in `nodes`.
#[derive(Debug, ActixMessage)]
#[rtype(result = "()")]
pub struct ToNodes {
    /// The nodes that get it.
    pub nodes: Vec<String>,
    /// The message, shared.
    pub message: Arc<NodeMessage>,
}

impl ToNodes {
    /// A watch's push ([`application::watch_push`], its resource naming any one of them) for
    /// every node in `nodes`, that all see the object alike: one message, encoded once
    /// ([`NodeMessage::untracked`]).
    pub(crate) fn untracked_for(nodes: Vec<String>, message: Message) -> Self {
        ToNodes {
            nodes,
            message: NodeMessage::untracked(message),
        }
    }

    /// A watch's corrected view for every node in `nodes`, that all see the object alike:
    /// [`NodeMessage::refresh`].
    pub(crate) fn refresh_for(nodes: Vec<String>, message: Message) -> Self {
        ToNodes {
            nodes,
            message: NodeMessage::refresh(message),
        }
    }

    /// `message` for the one node its cloud-form resource names; `None` if it names none.
    pub fn from_message(message: Message) -> Option<Self> {
        let node = edgehive_protocols::node_of(message.resource())?.to_owned();
        Some(ToNodes {
            nodes: vec![node],
            message: NodeMessage::from_owned(message),
        })
    }
}

/// An edge acknowledged an object: what SyncController records per node and object.
///
/// Published by the node's actor, after the pool has recorded it, to the module named
/// [`route::SYNCCONTROLLER`] when one runs (no consumer: nothing is sent).
#[derive(Debug, Clone, PartialEq, Eq, ActixMessage)]
#[rtype(result = "()")]
pub struct Acked {
    /// The node.
    pub node: String,
    /// The object key ([`NodeMessage::key`]: its UID, or the resource).
    pub key: String,
    /// The resource in edge form (`{ns}/{type}/{name}`).
    pub resource: String,
    /// The acknowledged resourceVersion (`None` for messages without one).
    pub resource_version: Option<String>,
    /// Whether the acknowledged message deleted the object.
    pub deleted: bool,
    /// The object, when the message carried one ([`ObjectId::of`]).
    pub object: Option<Arc<ObjectId>>,
}

/// Objects were queued for nodes (a new entry in the pool, or a newer version replacing a
/// waiting one): SyncController records them (status `"0"` when new) so a restarted cloud
/// knows they are owed, also to nodes that are offline, and its reconcile does not resend
/// what a pool already holds. One per [`ToNodes`], for all of its nodes.
#[derive(Debug, Clone, PartialEq, Eq, ActixMessage)]
#[rtype(result = "()")]
pub struct Queued {
    /// The nodes it was newly queued for.
    pub nodes: Vec<String>,
    /// The object.
    pub object: Arc<ObjectId>,
    /// The resourceVersion now waiting in those nodes' pools.
    pub resource_version: Option<String>,
}

/// A node was deleted from the cluster: CloudHub closes its connection.
#[derive(Debug, ActixMessage)]
#[rtype(result = "bool")]
pub struct DisconnectNode {
    /// The node to disconnect.
    pub node: String,
}

/// A node was deleted from the cluster: CloudHub writes what is queued for it (the node
/// delete), closes its connection and forgets the node (its actor and pool). `true` if it
/// knew the node.
#[derive(Debug, ActixMessage)]
#[rtype(result = "bool")]
pub(crate) struct NodeDeleted {
    /// The deleted node.
    pub node: String,
}

/// A node came back with another store than before (new, emptied or replaced): CloudHub has
/// forgotten what it ACKed, and EdgeController sends it everything bound to it again.
#[derive(Debug, Clone, PartialEq, Eq, ActixMessage)]
#[rtype(result = "()")]
pub(crate) struct ResyncNode {
    /// The node.
    pub node: String,
    /// The identity of the store the node came back with, which EdgeController records on
    /// the Node ([`STORE_ID_ANNOTATION`]).
    pub store_id: String,
}

/// The Node annotation holding the identity of the edge's store the cloud last saw
/// (`edgehive-store-id` in the handshake): it outlives the cloud process and is shared by
/// replicas, so a cloud that never saw the node's previous store still tells a replaced one.
/// Written by EdgeController with a merge patch, only when it changes.
pub(crate) const STORE_ID_ANNOTATION: &str = "edgehive.io/store-id";

/// This process saw the node's store for the first time (a session's `edgehive-store-id`):
/// EdgeController compares it with the one recorded on the Node ([`STORE_ID_ANNOTATION`]).
/// None recorded: it is recorded, nothing is resent. Another one: CloudHub is told
/// ([`StoreReplaced`]).
#[derive(Debug, Clone, PartialEq, Eq, ActixMessage)]
#[rtype(result = "()")]
pub(crate) struct StoreSeen {
    /// The node.
    pub node: String,
    /// Its store's identity.
    pub store_id: String,
}

/// The Node records another store than the one the node connected with: CloudHub forgets
/// what the node ACKed (and what the sync records say it did) and asks EdgeController to
/// send everything again ([`ResyncNode`]), if the node is still on that store.
#[derive(Debug, Clone, PartialEq, Eq, ActixMessage)]
#[rtype(result = "()")]
pub(crate) struct StoreReplaced {
    /// The node.
    pub node: String,
    /// The store it connected with.
    pub store_id: String,
}

/// Whether `message` goes to the ACK lane (`true`) or is written once without ACK (`false`).
///
/// No ACK, as in KubeEdge's cloudhub, if any of: the resource mentions `podlist`,
/// `membership`, `twin/cloud_updated`, `serviceaccounttoken` or `k8s/ca.crt`; the operation is
/// a CSI volume operation or `applicationResponse`; the group is `user`; the source is
/// `taskmanager` or `nodeupgradejobcontroller`; the resource is DynamicController's
/// `ignore/Application/ignore`; it is a `response` whose content is the string
/// `"OK"`; or the source is `edgecontroller` and the resource type is node (unless the
/// operation is update), lease, nodepatch, podpatch, podstatus, certificatesigningrequest, or
/// pod with operation `response`. (KubeEdge also treats a response carrying a Go error as
/// no-ACK; a Go error has no wire form we can recognise, so such replies take the ACK lane.)
///
/// And, edgehive's own rule, no ACK for a reply an edge waits for that no edge would ACK
/// ([`is_unacked_reply`]): an `error` reply, or a reply without a group. KubeEdge puts them
/// in its ACK queue, which cannot key them (no object UID) and drops them; the ACK lane here
/// would drop them too (no resourceVersion) or resend them until a timeout, while the edge's
/// waiting request takes the first copy whatever the group. Replies that carry an object
/// (a remote query's configmap) stay in the ACK lane: MetaManager stores and ACKs them.
pub(crate) fn needs_ack(message: &Message) -> bool {
    if is_unacked_reply(message) {
        return false;
    }
    const NO_ACK_RESOURCES: [&str; 5] = [
        "podlist",
        "membership",
        "twin/cloud_updated",
        "serviceaccounttoken",
        "k8s/ca.crt",
    ];
    let resource = message.resource();
    if NO_ACK_RESOURCES.iter().any(|part| resource.contains(part)) {
        return false;
    }
    // DynamicController's answers, also its `error` to content that is no Application
    // (edgehive's; KubeEdge sends none).
    if resource.ends_with(edgehive_protocols::application::APPLICATION_RESPONSE_RESOURCE) {
        return false;
    }
    let operation = message.operation();
    if matches!(
        operation,
        Some(
            Operation::CreateVolume
                | Operation::DeleteVolume
                | Operation::ControllerPublishVolume
                | Operation::ControllerUnpublishVolume
                | Operation::ApplicationResponse
        )
    ) {
        return false;
    }
    if message.group() == Some(&Group::User) {
        return false;
    }
    if let Some(source) = message.source() {
        if matches!(source, ModuleName::TaskManager)
            || source.as_str() == "nodeupgradejobcontroller"
        {
            return false;
        }
    }
    let is_response = operation == Some(&Operation::Response);
    if is_response && message.content_str() == Some("OK") {
        return false;
    }
    if message.source() == Some(&ModuleName::EdgeController) {
        if let Ok(parsed) = CloudResource::parse(resource) {
            let no_ack = match parsed.resource_type {
                ResourceType::Node => operation != Some(&Operation::Update),
                ResourceType::Lease
                | ResourceType::NodePatch
                | ResourceType::PodPatch
                | ResourceType::PodStatus
                | ResourceType::CertificateSigningRequest => true,
                ResourceType::Pod => is_response,
                _ => false,
            };
            if no_ack {
                return false;
            }
        }
    }
    true
}

/// Whether `message` answers an edge's request (a parent id, operation `response` or
/// `error`) in a way no edge ACKs: an `error` (its content is the reason, nothing is stored),
/// or with no group (a real edge routes a reply by its group, and drops one without; an
/// edgehive edge hands it to the waiting request, which does not ACK).
pub(crate) fn is_unacked_reply(message: &Message) -> bool {
    if message.parent_id().is_none() {
        return false;
    }
    let no_group = message
        .group()
        .is_none_or(|group| group.as_str().is_empty());
    match message.operation() {
        Some(Operation::Error) => true,
        Some(Operation::Response) => no_group,
        _ => false,
    }
}

/// The ACK-lane key of a message: the object's UID, or the resource string when the content
/// has none (responses, device messages). The resource is taken in edge form, so the key is
/// the same for every node.
pub(crate) fn ack_key(message: &Message) -> String {
    message.content["metadata"]["uid"]
        .as_str()
        .filter(|uid| !uid.is_empty())
        .map(str::to_owned)
        .unwrap_or_else(|| trim_for_edge(message.resource()))
}

/// The cloud's routing table: the names and groups of its built-in modules, and which one
/// owns an upstream message. Nothing else on the cloud side spells a module name.
pub mod route {
    use edgehive_protocols::{Group, Message, Operation};

    /// CloudHub's module name and group.
    pub const CLOUDHUB: &str = "cloudhub";
    /// EdgeController's module name and group.
    pub const EDGECONTROLLER: &str = "edgecontroller";
    /// DeviceController's module name and group.
    pub(crate) const DEVICECONTROLLER: &str = "devicecontroller";
    /// DynamicController's module name and group (KubeEdge's): a MetaServer's applications.
    pub const DYNAMICCONTROLLER: &str = "dynamiccontroller";
    /// The NodeGroup controller's module name and group (KubeEdge runs it in its
    /// controller manager).
    pub const NODEGROUPCONTROLLER: &str = "nodegroupcontroller";
    /// SyncController's module name (KubeEdge's; reserved).
    pub const SYNCCONTROLLER: &str = "synccontroller";
    /// The router module that takes `user`-group uploads (KubeEdge's; an extension, see the
    /// `edgehive` crate's `router`).
    pub const ROUTER: &str = "router";
    /// The group of task managers (KubeEdge's; extensions).
    pub(crate) const TASKMANAGER: &str = "taskmanager";
    /// The edge module whose upstream messages go to DeviceController.
    const EDGE_TWIN: &str = "twin";

    /// Cloud modules: an upstream message claiming one as its source would loop.
    const CLOUD_SOURCES: [&str; 7] = [
        CLOUDHUB,
        NODEGROUPCONTROLLER,
        "cloudStream",
        DEVICECONTROLLER,
        DYNAMICCONTROLLER,
        EDGECONTROLLER,
        SYNCCONTROLLER,
    ];

    /// Where an upstream message goes.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Destination {
        /// EdgeController, as a typed request.
        EdgeController,
        /// DeviceController, as a typed twin request.
        DeviceController,
        /// DynamicController, as a typed application (a MetaServer's request).
        DynamicController,
        /// One module by name.
        Module(&'static str),
        /// Every module of a group.
        Group(&'static str),
    }

    /// KubeEdge's DispatchUpstream: `user` uploads to the router, task operations to the task
    /// managers, group `dynamiccontroller` (a MetaServer's applications) to DynamicController,
    /// the edge twin's messages to DeviceController, the rest to EdgeController.
    /// `None` for a message that claims a cloud module as its source.
    pub(crate) fn upstream_destination(message: &Message) -> Option<Destination> {
        let source = message.source().map(|s| s.as_str());
        if source.is_some_and(|source| CLOUD_SOURCES.contains(&source)) {
            return None;
        }
        let operation = message.operation();
        Some(
            if operation == Some(&Operation::Upload) && message.group() == Some(&Group::User) {
                Destination::Module(ROUTER)
            } else if matches!(
                operation,
                Some(Operation::Prepull | Operation::Upgrade | Operation::UpdateNodeActionStatus)
            ) {
                Destination::Group(TASKMANAGER)
            } else if message.group() == Some(&Group::DynamicController) {
                Destination::DynamicController
            } else if source == Some(EDGE_TWIN) {
                Destination::DeviceController
            } else {
                Destination::EdgeController
            },
        )
    }
}
