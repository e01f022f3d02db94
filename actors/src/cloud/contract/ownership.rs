//! What the replica's ownership (`cloud::ownership`) tells CloudHub and SyncController when
//! several cloud replicas share one cluster. A process alone on its cluster never sends
//! these: it serves every node.

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

/// This replica renewed its Lease (`acting`: it acts for the nodes it serves) or could not
/// renew it in time and stepped down (nothing is sent, resent, reconciled or written until it
/// renews again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ActixMessage)]
#[rtype(result = "()")]
pub struct ReplicaActing {
    /// Whether the replica acts now.
    pub acting: bool,
}
