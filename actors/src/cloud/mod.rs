//! Cloud-side modules: [`cloudhub`] (the WebSocket server, one actor per edge node),
//! [`edgecontroller`] (cluster changes -> messages for edge nodes; edge requests -> the
//! cluster), [`devicecontroller`] (devices and twins), [`dynamiccontroller`] (an edge
//! MetaServer's reads), [`controllermanager`] (node groups), the [`cluster`] they read through one
//! port, and what they share: [`contract`] (the typed messages between them, the beehive
//! messages they send and the routing table), `outbox` (how a controller hands messages to
//! CloudHub) and [`watcher`] (how each follows a kind of the cluster).
//!
//! A Pod bound to an edge node is written to the cluster; [`edgecontroller`] sees it on its
//! watch and tells [`cloudhub`] a `ToNodes` (the message, encoded once), which queues it in
//! the node's pool; the node's actor writes it as a KubeEdge frame to the node's WebSocket,
//! resending until it is ACKed; the ACK becomes the node's ObjectSync record.
//!
//! Sibling modules never import each other: they share only `contract`, `outbox`, `cluster`,
//! [`ownership`] (which replica serves which node, when several share the cluster),
//! [`watcher`] (the one list→watch→relist machinery) and the hive; CloudHub alone is read by
//! others, for what it defines once (`cloudstream` its connection gates, `dynamiccontroller`
//! its `BindingView` of what is bound to a node), and imports none of them.

pub mod cloudhub;
pub mod cloudstream;
pub mod cluster;
pub mod contract;
pub mod controllermanager;
pub mod devicecontroller;
pub mod dynamiccontroller;
pub mod edgecontroller;
pub(crate) mod outbox;
pub mod ownership;
pub mod standin;
pub mod synccontroller;
pub mod watcher;
