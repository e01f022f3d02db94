//! What the replica's ownership (`cloud::ownership`) tells CloudHub and SyncController when
//! several cloud replicas share one cluster (a process alone on its cluster serves every
//! node), and what SyncController tells CloudHub of the records it read: what each node's
//! edge acknowledged, so a pool that starts empty sends none of it again.

use actix::Message as ActixMessage;

/// This replica now serves `node` (`mine`: its claim, written when the node's session opened
/// here, is in the cluster) or no longer does (another replica's claim replaced it: the
/// node's edge connected there). CloudHub starts writing to the node's session, or closes
/// it; SyncController reads the node's records, or forgets them.
#[derive(Debug, Clone, PartialEq, Eq, ActixMessage)]
#[rtype(result = "()")]
pub struct NodeOwner {
    /// The node.
    pub node: String,
    /// Whether this replica serves it now.
    pub mine: bool,
}

/// SyncController read the records of a node this replica came to serve: the versions the
/// node acknowledged (to another replica, before). CloudHub's pool of the node takes them as
/// acknowledged, so what the edge already has is not sent again, and only then starts
/// writing to the node's session. `acked` is empty when the replica served the node already
/// (its pool knows) or keeps no records.
#[derive(Debug, Clone, PartialEq, Eq, ActixMessage)]
#[rtype(result = "()")]
pub struct RecordsRead {
    /// The node.
    pub node: String,
    /// Object key (UID) and acknowledged resourceVersion, per record.
    pub acked: Vec<(String, String)>,
}

/// SyncController read every record at start, in a process alone on its cluster (one list
/// of each record kind): per node the cluster still has, the versions its edge acknowledged
/// (to this process before a restart, or to another that served the cluster). CloudHub's
/// pools take them as acknowledged, as for [`RecordsRead`], and the sessions that opened
/// meanwhile are written to from now on.
#[derive(Debug, Clone, PartialEq, Eq, ActixMessage)]
#[rtype(result = "()")]
pub struct RecordsLoaded {
    /// Each node with acknowledged records.
    pub nodes: Vec<RecordsRead>,
}

/// This replica renewed its Lease (`acting`: it acts for the nodes it serves) or could not
/// renew it in time and stepped down (nothing is sent, resent, reconciled or written until it
/// renews again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ActixMessage)]
#[rtype(result = "()")]
pub struct ReplicaActing {
    /// Whether the replica acts now.
    pub acting: bool,
}

/// This replica has been stepped down for `handOverAfter` while session `session` of `node`
/// was open here: CloudHub closes that session (if it is still the node's), so the node's
/// edge dials the next replica on its list.
#[derive(Debug, Clone, PartialEq, Eq, ActixMessage)]
#[rtype(result = "()")]
pub struct HandOver {
    /// The node.
    pub node: String,
    /// The session to close.
    pub session: u64,
}
